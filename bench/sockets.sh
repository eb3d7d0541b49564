#!/usr/bin/env bash
# Sockets under shunt on two namespace hosts with two rails (100 Mbit/s tbf
# on every link): the throughput of ONE TCP connection without shunt (one
# rail) and with it (MPTCP, a subflow per rail); then the longest delivery
# pause of one stream when rail 0 is black-holed, with shunt's backup
# marking (probes + in-band), in-band only, without marking (the kernel's
# own stale detection), under Debian's `mptcpize run` with the endpoints an
# administrator would set (the anchor), and plain TCP.
. "$(dirname "$0")/../test/lib.sh"
. "$ROOT/test/fabric/sockets-lib.bash"
sock_need iperf3 mptcpize
RATE=${SOCK_BENCH_RATE:-100}
sock_fabric_up "sb$$" --rate "$RATE"
GAP=$ROOT/bench/sockets_gap.py

iperf_rate() {  # WITH -> Mbit/s of one connection h1 -> h2 over 6 s
  local port=$(free_port) e1=() e2=()
  [ "$1" = shunt ] && { e1=($(sock_env 1)); e2=($(sock_env 2)); }
  ip netns exec "$(sock_ns h2)" env "${e2[@]}" iperf3 -s -1 -p $port >/dev/null 2>&1 &
  sleep 1
  ip netns exec "$(sock_ns h1)" env "${e1[@]}" iperf3 -c 10.0.2.2 -p $port -P 1 -t 6 -O 1 -J > "$TMP/ip.json"
  wait
  jget "$TMP/ip.json" '"%.1f" % (d["end"]["sum_received"]["bits_per_second"] / 1e6)'
}

echo "one connection, $RATE Mbit/s per rail:"
one=$(iperf_rate plain)
two=$(iperf_rate shunt)
echo "  without shunt (TCP, rail 0):     $one Mbit/s"
echo "  with shunt (MPTCP, rails 0+1):   $two Mbit/s"
echo "  ratio: $(python3 -c "print('%.2f' % ($two / $one))")x (target >= 1.7x)"

gap_run() {  # LABEL WITH [ENV...] -> longest pause after black-holing rail 0 at 3 s
  local label=$1 with=$2; shift 2
  local kind
  local port=$(free_port) pre1=(env) pre2=(env)
  case $with in
    shunt) pre1=(env $(sock_env 1) "$@"); pre2=(env $(sock_env 2) "$@") ;;
    mptcpize) pre1=(mptcpize run); pre2=(mptcpize run) ;;
  esac
  local res=()
  for kind in stream pingpong; do
    port=$(free_port)
    if [ $kind = stream ]; then
      ip netns exec "$(sock_ns h2)" "${pre2[@]}" python3 "$GAP" recv $port 11 > "$TMP/gap.txt" 2>"$TMP/gap.err" &
    else
      ip netns exec "$(sock_ns h2)" "${pre2[@]}" python3 "$GAP" echo $port 11 2>"$TMP/gap.err" &
    fi
    local r=$!
    sleep 1
    if [ $kind = stream ]; then
      ip netns exec "$(sock_ns h1)" "${pre1[@]}" python3 "$GAP" send 10.0.2.2 $port 10 2>/dev/null &
    else
      ip netns exec "$(sock_ns h1)" "${pre1[@]}" python3 "$GAP" ping 10.0.2.2 $port 10 > "$TMP/gap.txt" 2>/dev/null &
    fi
    local s=$!
    sleep 3
    fab fault blackhole h1-r0 >/dev/null
    wait $s; wait $r
    fab fault unblackhole h1-r0 >/dev/null
    res+=("$(sed -n 's/.*max_[a-z]*_s=\([0-9.]*\).*/\1/p' "$TMP/gap.txt")")
    sleep 1
  done
  printf '  %-44s %8s s %8s s\n' "$label:" "${res[0]:-?}" "${res[1]:-?}"
}

echo "rail 0 black-holed at 3 s (run 10 s): longest pause of a bulk stream, longest round trip of 4 KiB ping-pong:"
printf '  %-44s %10s %10s\n' "" "stream" "pingpong"
gap_run "shunt, backup marking (probes + in-band)" shunt
gap_run "shunt, backup marking (in-band only)" shunt SHUNT_PROBE_ADDRS= SHUNT_SOCKET_RAILS=auto
gap_run "shunt, no marking (kernel stale detection)" shunt SHUNT_RAIL_INBAND=off SHUNT_PROBE_ADDRS= SHUNT_SOCKET_RAILS=auto
for i in 1 2; do
  ip -n "$(sock_ns h$i)" mptcp endpoint flush  # what shunt's agents left
  ip -n "$(sock_ns h$i)" mptcp limits set subflows 4 add_addr_accepted 4
  ip -n "$(sock_ns h$i)" mptcp endpoint add 10.1.$i.2 signal subflow
done
gap_run "mptcpize run, admin endpoints (anchor)" mptcpize
for i in 1 2; do ip -n "$(sock_ns h$i)" mptcp endpoint flush; done
gap_run "plain TCP (no recovery while black-holed)" plain
