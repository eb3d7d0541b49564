#!/usr/bin/env bash
# A TCP socket shunt cannot track (its table full: SHUNT_TEST_SOCKET_RECORDS
# open sockets) stays the plain TCP socket the application asked for, never
# an untracked MPTCP one (SO_PROTOCOL 262, TCP-only options refused); once
# tracked sockets close, new ones are tracked (and opened as MPTCP) again.
# timeout: 30
. "$(dirname "$0")/../lib.sh"
prog=$B/test/sock_churn
[ -x "$prog" ] || fail "no $prog"
[ "$(cat /proc/sys/net/mptcp/enabled 2>/dev/null)" = 1 ] || skip "this kernel opens no MPTCP socket"
timeout -k 5 20 env SHUNT_TEST_SOCKET_RECORDS=3 SHUNT_STATS_FILE=$TMP/s.json SHUNT_RUN_DIR=$TMP/run \
  SHUNT_LOG_LEVEL=info SHUNT_LOG_FILE=$TMP/log LD_PRELOAD=$LIB "$prog" cap 5 > "$TMP/out.txt" || fail "sock_churn failed"
cat "$TMP/out.txt"
expect_eq "$(awk '{print $3}' "$TMP/out.txt" | sort -u)" 6 "SO_PROTOCOL of every socket, tracked or not"
s=$TMP/s.json
# sock0..2 tracked; sock3, sock4 not; sock0, sock1 closed; again0, again1 tracked in their place.
expect_eq "$(jget "$s" '[(x["open"], x["upgraded"]) for x in d["sockets"]]')" \
  "[(False, True), (False, True), (True, True), (True, True), (True, True)]" "tracked sockets, all opened as MPTCP"
expect_eq "$(jget "$s" 'd["sockets_untracked"]')" 2 "sockets left untracked"
# Beyond the cap the kernel has the plain socket: nothing of MPTCP on it.
expect_eq "$(grep -c "3 sockets open at once" "$TMP/log")" 1 "the cap said once"
