#!/usr/bin/env bash
# A PyTorch Gloo all_to_all_single loop (timeout 10 s, every result checked)
# on two namespace hosts with two rails survives rail 0 down for 15 s and
# rail 0 black-holed for 15 s under libshunt (its TCP rides MPTCP with a
# subflow on each rail); the same job without shunt fails the 15 s outage.
# The agent marks the failed rail backup and restores it afterwards. Then an
# administrator flushes the endpoints and lowers the limits while the last
# job's subflows (here: a listener) still hold the join port: the next job's agent
# puts them back (on the next free join port) and survives the black hole.
# timeout: 260
. "$(dirname "$0")/../lib.sh"
. "$(dirname "$0")/sockets-lib.bash"
sock_need /usr/bin/python3 nft
/usr/bin/python3 -c 'import torch.distributed' 2>/dev/null || skip "no python3-torch (make deps)"
[ -f "$LIB" ] || fail "no $LIB"
sock_fabric_up "sg$$"

gloo_run down-shunt shunt 24 5 fault_down_for 15
echo "shunt, rail 0 down 15 s:       $GLOO_SUMMARY"
[ "$GLOO_RC" = 0 ] || fail "with shunt the job did not survive rail 0 down for 15 s"
grep -q "rail 10.0.1.2 failing" "$TMP/gloo-down-shunt-rank0.log" || fail "h1's agent never marked rail 0 backup"
grep -q "rail 10.0.1.2 healthy" "$TMP/gloo-down-shunt-rank0.log" || fail "h1's agent never restored rail 0"
ok "survives rail 0 down for 15 s"

gloo_run down-plain plain 24 5 fault_down_for 15
echo "no shunt, rail 0 down 15 s:    $GLOO_SUMMARY"
[ "$GLOO_RC" != 0 ] || fail "without shunt the job survived too: the fault proves nothing"
ok "the same job without shunt fails"

gloo_run bh-shunt shunt 24 5 fault_blackhole_for 15
echo "shunt, rail 0 black hole 15 s: $GLOO_SUMMARY"
[ "$GLOO_RC" = 0 ] || fail "with shunt the job did not survive rail 0 black-holed"
ok "survives rail 0 black-holed for 15 s"

for i in 1 2; do
  ip -n "$(sock_ns h$i)" mptcp endpoint flush
  ip -n "$(sock_ns h$i)" mptcp limits set subflows 0 add_addr_accepted 0
done
# Whether the last job's TIME-WAIT subflows hold h1's join port depends on
# which side closed first: a listener holds it for sure.
ip netns exec "$(sock_ns h1)" /usr/bin/python3 -c 'import socket, time
s = socket.socket(); s.bind(("10.1.1.2", 7473)); s.listen(); time.sleep(60)' &
holder=$!
at_exit "kill $holder 2>/dev/null"
sleep 0.5
gloo_run bh-flushed shunt 24 5 fault_blackhole_for 15
kill $holder 2>/dev/null
echo "shunt, after a flush, black hole: $GLOO_SUMMARY"
grep -h "signal endpoint\|MPTCP endpoints" "$TMP"/gloo-bh-flushed-rank*.log
[ "$GLOO_RC" = 0 ] || fail "after an endpoint flush the job did not survive rail 0 black-holed"
for r in 0 1; do
  grep -q "MPTCP endpoints ok" "$TMP/gloo-bh-flushed-rank$r.log" || fail "rank $r's agent did not restore its endpoints"
done
grep -q "signal endpoint 10.1.1.2 port 7474 added" "$TMP/gloo-bh-flushed-rank0.log" || fail "h1's agent did not move to the next join port"
ok "survives rail 0 black-holed after the endpoints were flushed"
