#!/usr/bin/env bash
# Clock sync bench (a report, no timed assertions). Four hosts in network
# namespaces, two rails each, tbf bottlenecks and on/off UDP cross traffic;
# every host runs shunt-probe with a known virtual test clock. Reports, for
# the same run and traffic:
#   shunt  - offset error p50/p99/max, drift error, convergence, holdover error
#   naive  - NTP-style (latest forward - latest reverse) / 2 on the same probes
#   chrony - chronyd -x (never touches the clock) in host 3 against a chronyd
#            server in host 1 on rail 0 (truth 0: both share the kernel clock)
#   cost   - probe bytes/s per peer against a 100 Gb/s link; CPU (user+sys s per
#            wall s) per host against the 2% of one core target
# Usage: bench/clocksync.sh [DURATION_S]   (root; about DURATION + 10 s)
set -u
cd "$(dirname "$0")/.."
CS_PREFIX=csb$$-
. test/e2e/clocksync_lib.bash
BIN=${BUILD:-build}/bin/shunt-probe
[ -x "$BIN" ] || { echo "build $BIN first (make $BIN)"; exit 77; }
cs_need_root
OUT=$(mktemp -d /tmp/clocksync-bench.XXXXXX)
trap 'cs_cleanup; rm -rf "$OUT"' EXIT
DUR=${1:-40} HOLD=$((${1:-40} - 10)) HOSTS=4 RAILS=2

cs_mesh $HOSTS $RAILS
for i in 1 2 3 4; do cs_bottleneck $i 0 200mbit; done
cs_cross 1 3 0 300M 2 "$DUR" 5201
cs_cross 2 4 0 300M 3 "$DUR" 5202

# chronyd and chronyc: installed, else the copy `make bench` unpacked
CHRONYD=$(command -v chronyd || echo "${BUILD:-build}/chrony/usr/sbin/chronyd")
CHRONYC=$(command -v chronyc || echo "${BUILD:-build}/chrony/usr/bin/chronyc")
CHRONY=none
if [ -x "$CHRONYD" ] && [ -x "$CHRONYC" ]; then
  mkdir -p "$OUT/cs" "$OUT/cc"
  cat > "$OUT/cs/conf" <<EOC
local stratum 8
allow 10.0.0.0/8
bindaddress $(cs_addr 1 0)
pidfile $OUT/cs/pid
bindcmdaddress $OUT/cs/sock
cmdport 0
EOC
  cat > "$OUT/cc/conf" <<EOC
server $(cs_addr 1 0) iburst minpoll -2 maxpoll -2
pidfile $OUT/cc/pid
bindcmdaddress $OUT/cc/sock
cmdport 0
logdir $OUT/cc
log statistics measurements
EOC
  ip netns exec "$(cs_ns h1)" "$CHRONYD" -x -d -u root -f "$OUT/cs/conf" >"$OUT/cs/log" 2>&1 &
  CS_PIDS+=($!)
  ip netns exec "$(cs_ns h3)" "$CHRONYD" -x -d -u root -f "$OUT/cc/conf" >"$OUT/cc/log" 2>&1 &
  CS_PIDS+=($!)
  CHRONY=$OUT/cc
fi

EPOCH=$(date +%s%N)
CLOCK[1]="offset=0"
CLOCK[2]="offset=1500000,drift=80000,wander=200,wander_period=20"
CLOCK[3]="offset=-3200000,drift=-95000"
CLOCK[4]="offset=250000,drift=40000"
export SHUNT_JOB_KEY=clocksync-bench
PP=()
for i in $(seq 1 $HOSTS); do
  args=()
  for j in $(seq 1 $HOSTS); do [ "$j" = "$i" ] || args+=(--peer "h$j=$(cs_addrs $j $RAILS)"); done
  ip netns exec "$(cs_ns h$i)" "$BIN" --name "h$i" --listen "$(cs_addrs $i $RAILS)" "${args[@]}" \
    --test-clock "${CLOCK[$i]},epoch=$EPOCH" --shm "" --duration "$DUR" --holdover-at "$HOLD" \
    --json "$OUT/h$i.json" --quiet &
  CS_PIDS+=($!); PP+=($!)
done
for p in "${PP[@]}"; do wait "$p"; done
if [ "$CHRONY" != none ]; then
  "$CHRONYC" -h "$OUT/cc/sock" -n sourcestats > "$OUT/cc/sourcestats.txt" 2>&1 || true
fi
python3 bench/clocksync_report.py --holdover-at "$HOLD" --chrony "$CHRONY" "$OUT"/h*.json
