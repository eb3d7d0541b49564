#!/usr/bin/env bash
# timeout: 120
# Four hosts (network namespaces, two rails each) behind a router namespace
# with tbf bottlenecks and on/off UDP cross traffic. Every host runs the probe
# engine with a virtual test clock of known offset, drift (up to 100 ppm),
# wander and occasional steps (60 us every 9 s on host 3, -40 us every 7 s on
# host 2); every host's estimate of every peer must be within its
# error bound of the truth. Halfway, host 4's rail 1 goes down: every other
# host must declare that path dead within its dead time (SHUNT_RAIL_PROBE_EVERY
# x 250 ms) and one probe interval. The rails go out in every round here
# (SHUNT_RAIL_PROBE_EVERY=1, CS_RAIL_EVERY to change it): the test holds the
# estimator to its full sample rate. With the default, every second round,
# 95.9-96.4% of the series were within bound in four runs (98.4-98.6% at
# every round): a step is seen a round later, 200 ms instead of 100. An estimate is
# invalid for a moment while a suspected step awaits confirmation: the check
# takes the newest valid one of the last second where the final snapshot is
# invalid (unless that one is off beyond its bound: host 3 stepped while the
# pair h3-h4, down to one queued rail, had no samples; the estimator withdrew
# it), and fails any pair valid less than half the time (pairs of two
# stepping hosts were valid 79-94% of the time).
set -u
cd "$(dirname "$0")/../.."
. test/e2e/clocksync_lib.bash
BIN=${BUILD:-build}/bin/shunt-probe
[ -x "$BIN" ] || { echo "build $BIN first (make $BIN)"; exit 77; }
cs_need_root
trap cs_cleanup EXIT
OUT=$(mktemp -d /tmp/clocksync-e2e.XXXXXX)

# 24 s: the runs end between host 2's step at 21 s and host 3's at 27 s
# (of the shared epoch). At 20 s a slow machine's runs, each 20 s from its
# own start, ended within a second of host 2's step at 21 s, and a step
# that close to the end has no confirmed estimate yet: the pairs with host
# 4 (one rail left) failed as "no valid estimate" or 40 us outside their
# bound in 4 of 6 runs on such a machine.
HOSTS=4 RAILS=2 DUR=${CS_DURATION:-24} INTERVAL=100 DEAD=250 RAIL_EVERY=${CS_RAIL_EVERY:-1}
cs_mesh $HOSTS $RAILS
for i in 1 2 3 4; do cs_bottleneck $i 0 200mbit; done
cs_cross 1 3 0 300M 2 "$DUR" 5201
cs_cross 2 4 0 300M 3 "$DUR" 5202

EPOCH=$(( $(date +%s%N) ))
CLOCK[1]="offset=0"
CLOCK[2]="offset=1500000,drift=80000,wander=200,wander_period=20,step=-40000,step_every=7"
CLOCK[3]="offset=-3200000,drift=-95000,step=60000,step_every=9"
CLOCK[4]="offset=250000,drift=40000"
export SHUNT_JOB_KEY=clocksync-e2e-secret SHUNT_RAIL_PROBE_EVERY=$RAIL_EVERY
for i in $(seq 1 $HOSTS); do
  args=()
  for j in $(seq 1 $HOSTS); do [ "$j" = "$i" ] || args+=(--peer "h$j=$(cs_addrs $j $RAILS)"); done
  ip netns exec "$(cs_ns h$i)" "$BIN" --name "h$i" --listen "$(cs_addrs $i $RAILS)" "${args[@]}" \
    --interval-ms $INTERVAL --dead-ms $DEAD --test-clock "${CLOCK[$i]},epoch=$EPOCH" \
    --shm "/${CS_PREFIX}h$i" --duration "$DUR" --json "$OUT/h$i.json" --quiet &
  CS_PIDS+=($!)
  PROBE_PIDS+=($!)
done
sleep $((DUR / 2))
DEAD_AT=$(date +%s%N)
ip -n "$(cs_ns rt)" link set h4r1 down
for p in "${PROBE_PIDS[@]}"; do wait "$p" || { echo "shunt-probe exited with $?"; exit 1; }; done

# The pairs with host 4 ride one rail after 12 s, through a 200 Mbit/s
# bottleneck that host 2's on/off cross traffic overfills: after host 2's
# step at 21 s a CI run's h4 had no clean sample to confirm it for over 2 s,
# so its estimate of h2 stayed withdrawn through the last second (the final
# window was 1 s); a later one's for over 3 s, to the end of the run. The
# newest valid estimate of the last 5 s stands for the end, held to its
# bound at its own time (a withdrawn one still counts in the series, which
# must be valid half the time and within bound 95% of it).
python3 test/e2e/clocksync_check.py --settle 5 --final-window 5 --dead-at "$DEAD_AT" --dead-peer h4 --dead-rail 1 \
  --dead-within-ms $((RAIL_EVERY * DEAD + INTERVAL)) "$OUT"/h*.json
rc=$?
[ $rc = 0 ] && rm -rf "$OUT" || echo "results kept in $OUT"
exit $rc
