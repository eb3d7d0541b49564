# Shared by the clocksync end-to-end tests and bench/clocksync.sh (sourced).
# Builds N host namespaces, each with R rails (veth pairs) into one router
# namespace; rail r of host i is 10.(70+r).i.2/24, the router side .1.
# Everything lives in namespaces named ${CS_PREFIX}*, deleted by cs_cleanup.

CS_PREFIX=${CS_PREFIX:-cs$$-}
CS_PIDS=()

cs_need_root() {
  [ "$(id -u)" = 0 ] || { echo "needs root (network namespaces)"; exit 77; }
  command -v ip >/dev/null || { echo "needs iproute2"; exit 77; }
  ip netns add "${CS_PREFIX}probe" 2>/dev/null || { echo "cannot create network namespaces here"; exit 77; }
  ip netns del "${CS_PREFIX}probe"
}

cs_cleanup() {
  local p
  for p in "${CS_PIDS[@]}"; do kill "$p" 2>/dev/null; done
  for p in "${CS_PIDS[@]}"; do wait "$p" 2>/dev/null; done
  for n in $(ip netns list | awk '{print $1}' | grep "^${CS_PREFIX}"); do ip netns del "$n"; done
}

cs_ns() { echo "${CS_PREFIX}$1"; }

# cs_mesh HOSTS RAILS
cs_mesh() {
  local hosts=$1 rails=$2 i r rt
  rt=$(cs_ns rt)
  ip netns add "$rt"
  ip -n "$rt" link set lo up
  ip netns exec "$rt" sysctl -qw net.ipv4.ip_forward=1
  for i in $(seq 1 "$hosts"); do
    local h; h=$(cs_ns h$i)
    ip netns add "$h"
    ip -n "$h" link set lo up
    for r in $(seq 0 $((rails - 1))); do
      ip link add "r$r" netns "$h" type veth peer name "h${i}r$r" netns "$rt"
      ip -n "$h" addr add "10.$((70 + r)).$i.2/24" dev "r$r"
      ip -n "$h" link set "r$r" up
      ip -n "$rt" addr add "10.$((70 + r)).$i.1/24" dev "h${i}r$r"
      ip -n "$rt" link set "h${i}r$r" up
      ip -n "$h" route add "10.$((70 + r)).0.0/16" via "10.$((70 + r)).$i.1" dev "r$r"
    done
  done
}

# Router egress toward host i on rail r becomes a RATE bottleneck with a queue.
cs_bottleneck() {  # host rail rate
  ip netns exec "$(cs_ns rt)" tc qdisc replace dev "h$1r$2" root tbf rate "$3" burst 32kb latency 20ms
}

cs_addr() { echo "10.$((70 + $2)).$1.2"; }  # host rail

cs_addrs() {  # host rails -> ADDR,ADDR
  local out="" r
  for r in $(seq 0 $(($2 - 1))); do out="$out${out:+,}$(cs_addr "$1" "$r")"; done
  echo "$out"
}

# On/off UDP cross traffic from host a to host b on rail r (iperf3, else a
# python blaster), PERIOD seconds on, PERIOD off, for TOTAL seconds.
cs_cross() {  # a b rail rate period total port
  local a=$1 b=$2 r=$3 rate=$4 period=$5 total=$6 port=${7:-5201}
  if command -v iperf3 >/dev/null; then
    ip netns exec "$(cs_ns h$b)" iperf3 -s -p "$port" -B "$(cs_addr "$b" "$r")" >/dev/null 2>&1 &
    CS_PIDS+=($!)
    sleep 0.2
    ( end=$((SECONDS + total))
      while [ $SECONDS -lt $end ]; do
        timeout $((period + 3)) ip netns exec "$(cs_ns h$a)" iperf3 -u -c "$(cs_addr "$b" "$r")" -p "$port" \
          -B "$(cs_addr "$a" "$r")" -b "$rate" -t "$period" -l 1400 >/dev/null 2>&1
        sleep "$period"
      done ) &
    CS_PIDS+=($!)
  fi
}
