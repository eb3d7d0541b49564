#!/usr/bin/env bash
# A PyTorch Gloo all_to_all_single loop (timeout 10 s, every result checked)
# on two namespace hosts with two rails survives rail 0 down for 15 s and
# rail 0 black-holed for 15 s under libshunt (its TCP rides MPTCP with a
# subflow on each rail); the same job without shunt fails the 15 s outage.
# The agent marks the failed rail backup and restores it afterwards.
# timeout: 200
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
