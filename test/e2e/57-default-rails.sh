#!/usr/bin/env bash
# With no rail named (no SHUNT_PROBE_ADDRS, no SHUNT_SOCKET_RAILS), the host
# agent's rails are the IPv4 addresses behind the host's active RoCE ports:
# a fake sysfs tree (SHUNT_TEST_IB_SYSFS) lists two active RoCE ports on a
# namespace's two interfaces, a port that is down, and a RoCE port with only
# an IPv6 GID. With the job key alone (as shunt-run sets it): the probe
# engine runs on the two rails and the sockets' MPTCP endpoints are those
# two. Without a key: no probing, said once with the variable to set.
# SHUNT_PROBE_ADDRS=none: no rails, nothing touched.
# timeout: 60
. "$(dirname "$0")/../lib.sh"
[ "$(id -u)" = 0 ] || skip "needs root (network namespaces)"
[ -x "$B/test/hold_socket" ] && [ -x "$B/bin/shuntctl" ] || skip "build $B/test/hold_socket and shuntctl first"
ns=shunt-defrails-$$
ip netns add "$ns" || skip "cannot create a network namespace"
at_exit "ip netns del $ns 2>/dev/null"
ip -n "$ns" link add r0 type veth peer name r0p || fail "veth"
ip -n "$ns" link add r1 type veth peer name r1p || fail "veth"
ip -n "$ns" addr add 10.98.0.1/24 dev r0
ip -n "$ns" addr add 10.98.1.1/24 dev r1
ip -n "$ns" addr add 10.98.9.1/24 dev r1p  # a third address, behind no RoCE port
for d in lo r0 r0p r1 r1p; do ip -n "$ns" link set "$d" up; done

sys=$TMP/sys
gid() {  # DEV PORT STATE INDEX GID TYPE NDEV
  local p=$sys/$1/ports/$2
  mkdir -p "$p/gids" "$p/gid_attrs/types" "$p/gid_attrs/ndevs"
  echo "$3" > "$p/state"
  echo "$5" > "$p/gids/$4"; echo "$6" > "$p/gid_attrs/types/$4"; echo "$7" > "$p/gid_attrs/ndevs/$4"
}
v4=0000:0000:0000:0000:0000:ffff
gid roce1 1 "4: ACTIVE" 0 fe80:0000:0000:0000:0000:00ff:fe00:0001 "RoCE v2" r1
gid roce1 1 "4: ACTIVE" 1 $v4:0a62:0101 "RoCE v2" r1
gid roce0 1 "4: ACTIVE" 3 $v4:0a62:0001 "RoCE v2" r0
gid roce2 1 "1: DOWN" 1 $v4:0a62:0901 "RoCE v2" r1p
gid roce3 1 "4: ACTIVE" 0 fe80:0000:0000:0000:0000:00ff:fe00:0003 "RoCE v2" r1p

port=$(free_port)
run_job() {  # NAME [VAR=VALUE...]: a job's process; the agent's peers and sockets while it runs
  local name=$1; shift
  mkdir -p "$TMP/run-$name"
  local e=(env SHUNT_MODE=active SHUNT_RUN_DIR="$TMP/run-$name" SHUNT_METRICS_ADDR=off SHUNT_LOG_LEVEL=info
           SHUNT_LOG_FILE="$TMP/$name.log" SHUNT_TEST_IB_SYSFS="$sys" SHUNT_PROBE_PORT="$port" SHUNT_CLOCK_SHM= "$@")
  ip netns exec "$ns" "${e[@]}" LD_PRELOAD="$LIB" "$B/test/hold_socket" 3000 & local pid=$!
  at_exit "kill $pid 2>/dev/null"
  sleep 1.5
  ip netns exec "$ns" env SHUNT_RUN_DIR="$TMP/run-$name" "$B/bin/shuntctl" peers --json > "$TMP/$name-peers.json"
  ip netns exec "$ns" env SHUNT_RUN_DIR="$TMP/run-$name" "$B/bin/shuntctl" sockets --json > "$TMP/$name-sockets.json"
  ip -n "$ns" mptcp endpoint show > "$TMP/$name-endpoints"
  wait $pid || fail "$name: the job failed"
}

run_job keyed SHUNT_JOB_KEY=default-rails-$$
expect_eq "$(jget "$TMP/keyed-peers.json" "','.join(d['probing']['rails'])")" "10.98.0.1,10.98.1.1" "probe rails"
expect_eq "$(jget "$TMP/keyed-peers.json" "d['probing']['rails_from']")" "RoCE ports" "where the rails come from"
expect_eq "$(jget "$TMP/keyed-peers.json" "d['probing']['running']")" "True" "probe engine running"
grep -q "clocksync: rail 1 10.98.1.1:$port" "$TMP/keyed.log" || { cat "$TMP/keyed.log"; fail "the engine did not bind rail 1"; }
expect_eq "$(jget "$TMP/keyed-sockets.json" "','.join(r['addr'] for r in d['rails'])")" "10.98.0.1,10.98.1.1" "socket rails"
grep -q "10.98.1.1 .*signal" "$TMP/keyed-endpoints" || { cat "$TMP/keyed-endpoints"; fail "no signal endpoint on rail 1"; }
grep -q "10.98.9.1" "$TMP/keyed-endpoints" && fail "an address behind no active RoCE port became an endpoint"
ip netns exec "$ns" ip mptcp endpoint flush

run_job keyless SHUNT_JOB_KEY=
expect_eq "$(jget "$TMP/keyless-peers.json" "d['probing']['running']")" "False" "probe engine without a key"
n=$(grep -c "no probing" "$TMP/keyless.log")
[ "$n" = 1 ] || { cat "$TMP/keyless.log"; fail "$n log lines say that nothing is probed, want 1"; }
grep "no probing" "$TMP/keyless.log" | grep -q "shunt warning: .*set SHUNT_JOB_KEY" || fail "the line is no warning naming SHUNT_JOB_KEY"
ok "no key: $(grep "no probing" "$TMP/keyless.log")"
ip netns exec "$ns" ip mptcp endpoint flush

run_job off SHUNT_JOB_KEY=default-rails-$$ SHUNT_PROBE_ADDRS=none
expect_eq "$(jget "$TMP/off-peers.json" "d['probing']['running']")" "False" "probe engine with SHUNT_PROBE_ADDRS=none"
expect_eq "$(cat "$TMP/off-endpoints")" "" "endpoints with SHUNT_PROBE_ADDRS=none"

run_job named SHUNT_JOB_KEY=default-rails-$$ SHUNT_PROBE_ADDRS=10.98.9.1
expect_eq "$(jget "$TMP/named-peers.json" "','.join(d['probing']['rails'])")" "10.98.9.1" "named probe rails win"
