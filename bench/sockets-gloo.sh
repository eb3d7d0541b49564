#!/usr/bin/env bash
# Scenario: a PyTorch Gloo all_to_all_single loop (process group timeout
# 10 s, every result checked) on two namespace hosts with two rails, without
# and with libshunt, side by side, under four faults of rail 0: down for
# 15 s, black-holed for 15 s, down for good, and flapping every 500 ms for
# 30 s. SOCK_GLOO_CASES picks some (down,blackhole,forever,flap). The first
# case also runs under Debian's `mptcpize run` with the endpoints an
# administrator would set (signal subflow on rail 1, limits 4/4): the anchor.
. "$(dirname "$0")/../test/lib.sh"
. "$ROOT/test/fabric/sockets-lib.bash"
sock_need /usr/bin/python3
sock_fabric_up "sgs$$"
cases=${SOCK_GLOO_CASES:-down,blackhole,forever,flap}

row() {  # CASE SECONDS FAULT...
  local c=$1 secs=$2; shift 2
  local w
  for w in plain shunt; do
    gloo_run "$c-$w" $w "$secs" 5 "$@"
    printf '%-34s %-6s %s\n' "$c" "$w" "$GLOO_SUMMARY"
    fab fault port-up h1 r0 >/dev/null 2>&1
    fab fault unblackhole h1-r0 >/dev/null 2>&1
    fab fault link-up h1-r0 >/dev/null 2>&1
    sleep 1
  done
}
printf '%-34s %-6s %s\n' fault with result
if [[ $cases == *down* ]]; then
  row "rail 0 down 15 s" 25 fault_down_for 15
  for i in 1 2; do
    ip -n "$(sock_ns h$i)" mptcp endpoint flush
    ip -n "$(sock_ns h$i)" mptcp limits set subflows 4 add_addr_accepted 4
    ip -n "$(sock_ns h$i)" mptcp endpoint add 10.1.$i.2 signal subflow
  done
  gloo_run down-mptcpize mptcpize 25 5 fault_down_for 15
  printf '%-34s %-6s %s\n' "rail 0 down 15 s" mptcpize "$GLOO_SUMMARY"
  for i in 1 2; do ip -n "$(sock_ns h$i)" mptcp endpoint flush; done
  fab fault port-up h1 r0 >/dev/null 2>&1
fi
[[ $cases == *blackhole* ]] && row "rail 0 black-holed 15 s" 25 fault_blackhole_for 15
[[ $cases == *forever* ]] && row "rail 0 down for good" 25 fault_down_forever
[[ $cases == *flap* ]] && row "rail 0 flapping 500 ms for 30 s" 40 fault_flap 30
exit 0
