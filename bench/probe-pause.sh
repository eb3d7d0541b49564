#!/usr/bin/env bash
# The steady-state cost of probing inside one running job: the same
# fabric and job as bench/probe-cost.sh (2 hosts, 2 rails, 2 spines
# hashing addresses and UDP source port; one 2-rank shunt-bench sendrecv
# over verbs, WRITE_WITH_IMM, 1 MiB, -c 1, with the host agents probing
# both rails and every bundle path's source port), run once for
# PROBE_PAUSE_CYCLES cycles (default 8) of PROBE_PAUSE_SECONDS (default 10)
# with the probe engine paused on both hosts at once (`shuntctl probing
# --pause`: nothing sent, arrivals ignored, no path judged;
# ProbeEngine::pause_probing), then as long with probing on. Rank 0's timeline gives each
# window's throughput, leaving out a second at each edge; each paused window
# is set against the mean of the windows on either side of it. One
# schedule of pauses per host, by its own clock, set once: no command
# reaches a guest while the windows are measured.
#
# Why: runs of their own differ by more than what they measure. Each run
# of bench/probe-cost.sh brings up its own QPs, with their own ECMP
# placements, on a host whose load drifts, and invocations of it
# disagreed by a few points where their rounds' standard error was one.
# Here every window shares the job, its QPs and their paths, so the ratio
# moves with nothing but the probing.
#
# What it prices: the probe engine's work (its datagrams, wakeups, reads,
# estimates). Not what stays while it is paused: the agent, the sockets'
# rail thread and MPTCP endpoints, the bundles' failover workers and
# source path bookkeeping (bench/probe-cost.sh prices all of it against
# shunt without SHUNT_PROBE_ADDRS). Reported: each pause's on / paused
# throughput, their mean with its standard error, and the CPU time and
# wakeups of shunt's own threads on h1 (schedstat) in the two states.
SHUNT_ROOT=$(cd "$(dirname "$0")/.." && pwd)
. "$SHUNT_ROOT/test/fabric/lib.sh"
need_guests
BENCH=$B/bin/shunt-bench
CTL=$B/bin/shuntctl
CYCLES=${PROBE_PAUSE_CYCLES:-8}
WIN=${PROBE_PAUSE_SECONDS:-10}
[ "$WIN" -ge 4 ] || fail "PROBE_PAUSE_SECONDS must be at least 4 (a second at each edge is left out)"
up --hosts 2 --rails 2 --spines 2 --ecmp-hash sport
KEY=probe-pause-$$
boot=$(fab addr h1 r1)
port=$((29000 + RANDOM % 1000))
addrs() { echo "$(fab addr "h$1" r0),$(fab addr "h$1" r1)"; }
SETTLE=${PROBE_PAUSE_SETTLE:-20}  # the bundles' set-up and the clock models first
# The job runs until the stop file is there (rank 0 checks it), an hour
# at most.
DUR=3600
pids=()
for r in 1 0; do
  fab exec "h$((r + 1))" -- timeout $((DUR + 90)) env LD_PRELOAD="$LIB" SHUNT_MODE=active SHUNT_JOB_KEY="$KEY" \
    SHUNT_PROBE_ADDRS="$(addrs $((r + 1)))" ${PROBE_COST_ENV:-} "$BENCH" --rank $r --world 2 \
    --bootstrap "$boot:$port" -p sendrecv --transport verbs --verb write_imm -d rxe0 -b 1M -e 1M -w 2 \
    --duration "$DUR" --stop-file /tmp/probe-pause.stop -c 1 -q --seg 64K --retry-cnt 6 --qp-timeout 14 \
    --timeline 1000 --timeline-file /tmp/probe-pause.tl > "$TMP/rank$r" 2>&1 &
  pids+=($!)
done
# Shunt's threads on h1 (all but the rank's main thread): CPU ns and
# voluntary switches, summed, every second, by a loop of shell builtins in
# the guest (a forked command on the guests' 9p root costs more than what
# it would measure), the same in both states.
fab exec h1 -- bash -c 'for ((i = 0; i < 100; i++)); do
    for c in /proc/[0-9]*/comm; do read -r n < $c 2>/dev/null; [ "$n" = shunt-bench ] && p=${c%/comm}; done
    [ -n "$p" ] && break; sleep 0.2; done
  while [ -d "$p" ]; do
    ns=0 v=0; for t in $p/task/*; do [ "${t##*/}" = "${p#/proc/}" ] && continue
      { read -r s _ < $t/schedstat; while read -r a b; do [ "$a" = voluntary_ctxt_switches: ] && v=$((v + b)); done < $t/status; } 2>/dev/null
      ns=$((ns + ${s:-0})); done
    echo "$EPOCHREALTIME $ns $v"; sleep 1; done' > "$TMP/cpu" 2>&1 &
sleep "$SETTLE"
# One schedule on each host, by its own clock: CYCLES pauses of WIN
# seconds, one every 2 x WIN seconds (the two commands land within a
# second of each other, inside the pauses' margin).
cmds=()
for h in h1 h2; do
  fab exec $h -- "$CTL" probing --pause $((WIN * 1000)) --every $((2 * WIN * 1000)) --count "$CYCLES" --json \
    > "$TMP/pause-$h" 2>&1 &
  cmds+=($!)
done
wait "${cmds[@]}"
for h in h1 h2; do
  grep -q until_unix_ms "$TMP/pause-$h" || fail "pause on $h: $(cat "$TMP/pause-$h")"
done
sleep $((2 * CYCLES * WIN + WIN))  # the last pause and the on window after it
fab exec h1 -- touch /tmp/probe-pause.stop
for p in "${pids[@]}"; do wait "$p" || { cat "$TMP/rank0" "$TMP/rank1" >&2; fail "the job failed"; }; done
grep -q "^# Errors seen *: 0" "$TMP/rank0" || fail "errors seen: $(grep 'Errors seen' "$TMP/rank0")"
grep -h "shunt warning" "$TMP"/rank* | head -5
fab exec h1 -- cat /tmp/probe-pause.tl > "$TMP/tl" || fail "no timeline"
python3 - "$TMP/tl" "$TMP/pause-h1" "$TMP/cpu" "$WIN" <<'EOF'
import json, statistics as st, sys
rows = []
for l in open(sys.argv[1]):
    f = l.split()
    if len(f) >= 5 and f[0] == "#T" and f[1][0].isdigit():
        rows.append((float(f[1]), int(f[3])))  # end of the second (h1's clock), bytes in it
cpu = []
for l in open(sys.argv[3]):
    f = l.split()
    if len(f) == 3 and f[1].isdigit():
        cpu.append((float(f[0]), int(f[1]), int(f[2])))
pause = json.load(open(sys.argv[2]))["pause"]
win = int(sys.argv[4])
def rate(t0, t1):  # bytes a second over the whole seconds inside [t0 + 1, t1 - 1]
    got = [b for (w, b) in rows if t0 + 2 <= w <= t1 - 1]
    return sum(got) / len(got) if got else float("nan")
def threads(t0, t1):  # shunt's threads: share of the CPU, wakeups a second
    s = [c for c in cpu if t0 + 1 <= c[0] <= t1 - 1]
    if len(s) < 2:
        return None
    d = s[-1][0] - s[0][0]
    return (s[-1][1] - s[0][1]) / 1e9 / d, (s[-1][2] - s[0][2]) / d
ratios, use, extra = [], {"on": [], "paused": []}, []
for k in range(pause["count"]):
    t0 = (pause["from_unix_ms"] + k * pause["every_ms"]) / 1000
    t1 = t0 + (pause["until_unix_ms"] - pause["from_unix_ms"]) / 1000
    # Against the on windows on either side (a drift cancels).
    p, ref = rate(t0, t1), (rate(t0 - win, t0) + rate(t1, t1 + win)) / 2
    ratios.append(ref / p)
    u = {key: threads(*span) for key, span in (("paused", (t0, t1)), ("on", (t1, t1 + win)))}
    for key in u:
        if u[key]:
            use[key].append(u[key])
    if u["on"] and u["paused"]:  # the engine's own: on less paused, pause by pause
        extra.append((u["on"][0] - u["paused"][0], u["on"][1] - u["paused"][1]))
    print("  pause %d: on %.4f MB/s, paused %.4f MB/s, on / paused %.3f" % (k + 1, ref / 1e6, p / 1e6, ratios[-1]))
m = st.mean(ratios)
se = st.stdev(ratios) / len(ratios) ** 0.5 if len(ratios) > 1 else float("nan")
print("sendrecv 1 MiB, one job, %d pauses of %d s: probing on / paused %.3fx +- %.3f (standard error); "
      "the probe engine costs %.1f%% +- %.1f of the throughput (target of the failover issue: <= 2%%)"
      % (len(ratios), win, m, se, 100 * (1 - m), 100 * se))
def mean_se(xs):
    return st.mean(xs), (st.stdev(xs) / len(xs) ** 0.5 if len(xs) > 1 else float("nan"))
if extra:
    (c, ce), (w, we) = mean_se([x[0] for x in extra]), mean_se([x[1] for x in extra])
    print("  the probe engine on h1: %.2f%% +- %.2f of the guest's CPU, %.1f +- %.1f wakeups a second"
          % (100 * c, 100 * ce, w, we))
for k in ("on", "paused"):
    if use[k]:
        print("  shunt's threads on h1, probing %s: %.2f%% of the guest's CPU, %.1f wakeups a second (means over windows)"
              % (k, 100 * st.mean(x[0] for x in use[k]), st.mean(x[1] for x in use[k])))
EOF
