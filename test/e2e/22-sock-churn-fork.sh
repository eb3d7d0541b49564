#!/usr/bin/env bash
# A long job's socket churn: 4 threads open and close 100,000 TCP sockets
# while the main thread forks 50 times. No fork hangs (the socket table's lock
# never waits for the log's); closed sockets' records are reused, so the
# report stays as small as the open sockets and still sums every socket and
# byte exactly; the socket opened last is tracked, and one that shunt opened
# as MPTCP still answers SO_PROTOCOL with TCP and takes the TCP-only options.
# timeout: 90
. "$(dirname "$0")/../lib.sh"
prog=$B/test/sock_churn
[ -x "$prog" ] || fail "no $prog"
cycles=100000 forks=50 conns=200
timeout -k 5 60 env SHUNT_STATS_FILE=$TMP/s.json SHUNT_RUN_DIR=$TMP/run SHUNT_LOG_FILE=$TMP/log \
  LD_PRELOAD=$LIB "$prog" churn $cycles 4 $forks $conns > "$TMP/out.txt"
rc=$?
[ $rc = 124 ] || [ $rc = 137 ] && fail "hung: $(tail -n 1 "$TMP/out.txt") (forks and socket() in threads deadlocked)"
[ $rc = 0 ] || fail "sock_churn failed ($rc)"
ok "no hang: $(head -n 1 "$TMP/out.txt")"
expect_eq "$(awk '/^after/ {print $3}' "$TMP/out.txt")" 6 "SO_PROTOCOL of a socket opened after the churn"
expect_eq "$(awk '/^after/ {print $5, $7, $9}' "$TMP/out.txt")" "0 0 0" "TCP_QUICKACK, TCP_USER_TIMEOUT, IP_TTL taken"

s=$TMP/s.json
[ -f "$s" ] || fail "no stats file"
size=$(stat -c %s "$s")
[ "$size" -lt 262144 ] || fail "report of $size bytes after $cycles sockets closed (bounded by the open ones expected)"
ok "report $size bytes"
expect_eq "$(jget "$s" 'len(d["sockets"]) <= 66')" True "sockets listed one by one: the open ones and the last closed"
expect_eq "$(jget "$s" 'd["forks"]')" $forks "forks counted"
# Every socket counted once: listener, two per connection, the churn, the last one.
expect_eq "$(jget "$s" 'len(d["sockets"]) + sum(f["sockets"] for f in d["closed_sockets"])')" \
  $((1 + 2 * conns + cycles + 1)) "sockets in the report, open, closed and summed"
expect_eq "$(jget "$s" '[x["fd"] for x in d["sockets"] if x["open"]] != []')" True "the last socket is tracked"
expect_eq "$(jget "$s" 'sum(x["tx_bytes"] for k in ("sockets", "closed_sockets") for x in d[k])')" $((100 * conns)) "bytes sent, in all"
expect_eq "$(jget "$s" 'sum(x["rx_bytes"] for k in ("sockets", "closed_sockets") for x in d[k])')" $((100 * conns)) "bytes received, in all"
expect_eq "$(jget "$s" 'sum(x["accepts"] for k in ("sockets", "closed_sockets") for x in d[k])')" $conns "accepts, in all"
if [ "$(cat /proc/sys/net/mptcp/enabled 2>/dev/null)" = 1 ]; then
  expect_eq "$(jget "$s" 'sum(f["upgraded"] for f in d["closed_sockets"]) == sum(f["sockets"] for f in d["closed_sockets"])')" \
    True "every socket of the churn opened as MPTCP"
fi
