#!/usr/bin/env bash
# Without rails named (SHUNT_SOCKET_RAILS, SHUNT_PROBE_ADDRS) the agent of an
# active-mode job leaves the host's MPTCP endpoints and limits alone; with
# SHUNT_SOCKET_RAILS=auto it configures every up interface (which shows the
# check can see a change). Runs in a namespace the test creates.
# timeout: 60
. "$(dirname "$0")/../lib.sh"
[ "$(id -u)" = 0 ] || skip "needs root (network namespaces)"
ns=shunt-norail-$$
ip netns add "$ns" || skip "cannot create a network namespace"
at_exit "ip netns del $ns 2>/dev/null"
ip -n "$ns" link add v0 type veth peer name v1 || fail "veth"
ip -n "$ns" addr add 10.99.0.1/24 dev v0
ip -n "$ns" link set v0 up
ip -n "$ns" link set v1 up
ip -n "$ns" link set lo up
before=$(ip -n "$ns" mptcp limits show)
run_job() {  # extra env...
  mkdir -p "$TMP/run$#"
  ip netns exec "$ns" env SHUNT_MODE=active SHUNT_RUN_DIR="$TMP/run$#" SHUNT_METRICS_ADDR=off "$@" \
    LD_PRELOAD="$LIB" "$B/test/hold_socket" 2500 || fail "job failed"
}
run_job
expect_eq "$(ip -n "$ns" mptcp endpoint show)" "" "endpoints after a job with no rails named"
expect_eq "$(ip -n "$ns" mptcp limits show)" "$before" "limits after a job with no rails named"
run_job SHUNT_SOCKET_RAILS=auto
ip -n "$ns" mptcp endpoint show | grep -q "10.99.0.1" || fail "SHUNT_SOCKET_RAILS=auto configured nothing"
ok "auto: $(ip -n "$ns" mptcp endpoint show | tr '\n' ' ')"
