#!/usr/bin/env bash
# The steady-state cost of probing, on soft-RoCE guests: 2 hosts, 2 rails,
# 2 spines (routers hashing addresses and UDP source port, as the failover
# scenarios with --probes), one 2-rank shunt-bench sendrecv over verbs
# (WRITE_WITH_IMM, 1 MiB, -c 1) per run. Runs without libshunt, with
# libshunt active but no probe engine, and with the host agents probing
# both rails and every bundle path's source port (SHUNT_PROBE_ADDRS),
# interleaved, PROBE_COST_ROUNDS rounds (default 6, about 5 minutes: single
# runs move by a tenth, and two runs of four rounds at one version gave
# 0.929x and 0.941x, of six and eight at another 0.961x and 0.964x;
# PROBE_COST_ENV adds
# variables to the runs with probes, to price other settings). Reported: each run's
# busbw, the medians, their ratios, and the mean of each round's
# probes / shunt with its standard error (target of the failover issue:
# probing costs <= 2% busbw, i.e. probes / shunt >= 0.98). The guests have
# one CPU each on two host cores, so every probe packet costs the job: the
# ratio here is the worst case, not a datacenter host's. The busbw of
# these guests moves by a third between runs with the host's load, so
# each run also samples the CPU time of shunt's own threads on h1
# (bench/thread-cpu.sh): their share of the guest's CPU, a steadier
# figure of what shunt and its probing cost.
SHUNT_ROOT=$(cd "$(dirname "$0")/.." && pwd)
. "$SHUNT_ROOT/test/fabric/lib.sh"
need_guests
BENCH=$B/bin/shunt-bench
ROUNDS=${PROBE_COST_ROUNDS:-6}
DUR=${PROBE_COST_SECONDS:-15}
up --hosts 2 --rails 2 --spines 2 --ecmp-hash sport
KEY=probe-cost-$$
boot=$(fab addr h1 r1)
addrs() { echo "$(fab addr "h$1" r0),$(fab addr "h$1" r1)"; }

# run KIND -> busbw (GB/s) of rank 0
run() {
  local kind=$1 port=$((29000 + RANDOM % 1000)) pids=() r env
  for r in 1 0; do
    case $kind in
      none) env=(SHUNT_MODE=off) ;;
      shunt) env=(LD_PRELOAD="$LIB" SHUNT_MODE=active SHUNT_JOB_KEY="$KEY") ;;
      probes) env=(LD_PRELOAD="$LIB" SHUNT_MODE=active SHUNT_JOB_KEY="$KEY" SHUNT_PROBE_ADDRS="$(addrs $((r + 1)))" ${PROBE_COST_ENV:-}) ;;
    esac
    fab exec "h$((r + 1))" -- timeout $((DUR + 60)) env "${env[@]}" "$BENCH" --rank $r --world 2 \
      --bootstrap "$boot:$port" -p sendrecv --transport verbs --verb write_imm -d rxe0 -b 1M -e 1M -w 2 \
      --duration "$DUR" -c 1 -q --seg 64K --retry-cnt 6 --qp-timeout 14 > "$TMP/$kind-$r" 2>&1 &
    pids+=($!)
  done
  # shunt's own threads on h1 (the rank's threads but its main one), 8 s
  # of the run's steady state: what shunt costs the guest's one CPU.
  fab exec h1 -- bash "$SHUNT_ROOT/bench/thread-cpu.sh" shunt-bench $((DUR / 3)) $((DUR / 2)) > "$TMP/$kind-cpu" 2>&1 &
  pids+=($!)
  for p in "${pids[@]}"; do wait "$p" || { cat "$TMP/$kind-0" "$TMP/$kind-1" >&2; fail "$kind run failed"; }; done
  grep -q "^# Errors seen *: 0" "$TMP/$kind-0" || fail "$kind: errors seen: $(grep 'Errors seen' "$TMP/$kind-0")"
  awk '/Avg bus bandwidth/ { print $NF }' "$TMP/$kind-0"
}

declare -A all cpu
cpu_pct() { awk '{ printf "%.1f%%", 100 * $NF }' <<< "$1"; }  # the newest sample
for ((i = 1; i <= ROUNDS; i++)); do
  line="  round $i:"
  # shunt and probes in turns first, so neither always runs right after
  # the other (a run may pay for its predecessor's teardown).
  order="none shunt probes"
  ((i % 2)) || order="none probes shunt"
  for kind in $order; do
    bw=$(run $kind)
    [ -n "$bw" ] || fail "$kind: no busbw"
    all[$kind]+="$bw "
    line+=" $kind $bw"
    read -r _ h _ t _ < "$TMP/$kind-cpu" && [ "${t:-0}" -gt 0 ] || fail "$kind: no CPU sample: $(cat "$TMP/$kind-cpu")"
    cpu[$kind]+="$(awk -v h="$h" -v t="$t" 'BEGIN { printf "%.4f", h / t }') "
  done
  echo "$line GB/s; shunt's threads on h1: shunt $(cpu_pct "${cpu[shunt]}") probes $(cpu_pct "${cpu[probes]}")"
done
python3 - "${all[none]}" "${all[shunt]}" "${all[probes]}" "${cpu[shunt]}" "${cpu[probes]}" <<'EOF'
import statistics as st, sys
none, shunt, probes, cpu_shunt, cpu_probes = ([float(x) for x in a.split()] for a in sys.argv[1:6])
m = {k: st.median(v) for k, v in (("none", none), ("shunt", shunt), ("probes", probes))}
print("sendrecv 1 MiB busbw, median of %d runs: without libshunt %.4f, shunt without probes %.4f, "
      "shunt with probes %.4f GB/s" % (len(none), m["none"], m["shunt"], m["probes"]))
print("  probes / shunt: %.3fx (probing costs %.1f%%; target <= 2%%)" % (m["probes"] / m["shunt"],
      100 * (1 - m["probes"] / m["shunt"])))
# Each round's two runs are close in time, so their ratio shares the host's
# load: the mean of those ratios, with its standard error, says how well
# this invocation's rounds agree. Invocations (each on a fabric of its own)
# differ by a few points more than that (docs/design.md).
r = [p / s for p, s in zip(probes, shunt)]
se = st.stdev(r) / len(r) ** 0.5 if len(r) > 1 else float("nan")
print("  probes / shunt per round: mean %.3fx +- %.3f (standard error), median %.3fx" % (st.mean(r), se, st.median(r)))
print("  shunt / none:   %.3fx;  probes / none: %.3fx" % (m["shunt"] / m["none"], m["probes"] / m["none"]))
print("  shunt's own threads on h1 (all but the rank's main thread), median share of the guest's CPU: "
      "%.1f%% without probes, %.1f%% with" % (100 * st.median(cpu_shunt), 100 * st.median(cpu_probes)))
EOF
