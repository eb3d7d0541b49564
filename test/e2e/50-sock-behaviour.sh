#!/usr/bin/env bash
# Under libshunt (TCP sockets opened as MPTCP) a socket-heavy program behaves
# exactly as without it: non-blocking connect with epoll, accept4 flags,
# options MPTCP refuses (TCP_USER_TIMEOUT, TCP_QUICKACK, IP_TTL), SO_PROTOCOL,
# fork after connect, sendfile, half-close. Connected sockets stay MPTCP; one
# given a refused option before connecting is opened as TCP instead. In a
# namespace where MPTCP is disabled everything passes through, said once.
# timeout: 60
. "$(dirname "$0")/../lib.sh"
prog=$B/test/sock_behaviour
[ -x "$prog" ] || fail "no $prog"
"$prog" > "$TMP/plain.txt" || fail "fails even without shunt: $(tail -n 1 "$TMP/plain.txt")"
SHUNT_STATS_FILE=$TMP/s.json SHUNT_RUN_DIR=$TMP/run SHUNT_LOG_LEVEL=info SHUNT_LOG_FILE=$TMP/log \
  LD_PRELOAD=$LIB "$prog" > "$TMP/shunt.txt" || fail "fails under shunt: $(tail -n 1 "$TMP/shunt.txt")"
diff -u "$TMP/plain.txt" "$TMP/shunt.txt" || fail "output differs under shunt"
ok "same behaviour ($(grep -c ^ok "$TMP/shunt.txt") checks)"
expect_eq "$(jget "$TMP/s.json" '[(s["role"], s["upgraded"]) for s in d["sockets"]]')" \
  "[('listener', True), ('client', False), ('accepted', True)]" "sockets opened as MPTCP"
grep -q "TCP_USER_TIMEOUT\|IPPROTO_TCP/18" "$TMP/log" || fail "the downgrade was not logged"
ok "refused option on a fresh socket: opened as TCP, logged"

if [ "$(id -u)" = 0 ] && [ -e /proc/sys/net/mptcp/enabled ]; then
  ns=shunt-sockoff-$$
  ip netns add $ns || fail "netns add"
  at_exit "ip netns del $ns"
  ip -n $ns link set lo up
  ip netns exec $ns sysctl -qw net.mptcp.enabled=0
  ip netns exec $ns env SHUNT_STATS_FILE=$TMP/off.json SHUNT_RUN_DIR=$TMP/run2 SHUNT_LOG_FILE=$TMP/log2 \
    LD_PRELOAD=$LIB "$prog" > "$TMP/off.txt" || fail "fails where MPTCP is disabled"
  diff -u "$TMP/plain.txt" "$TMP/off.txt" || fail "output differs where MPTCP is disabled"
  expect_eq "$(grep -c "opens no MPTCP socket" "$TMP/log2")" 1 "pass-through said once"
  expect_eq "$(jget "$TMP/off.json" '[s["upgraded"] for s in d["sockets"]]')" "[False, False, False]" "nothing upgraded"
fi
