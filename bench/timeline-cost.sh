#!/usr/bin/env bash
# What --timeline costs: busbw of tcp alltoall on loopback with and without
# the timeline sampler, in back-to-back pairs (the order alternates), so
# each pair sees the same load on a shared machine; the ratio reported is
# the median of the per-pair ratios, with a bootstrap 90% interval. The
# sampler's own CPU time (from the JSON) bounds the cost independently of
# run-to-run noise. The hot path does the same relaxed atomic add with and
# without --timeline; only the sampler thread differs.
# Usage: bench/timeline-cost.sh [REPS] [INTERVAL_MS]
#   env: BUILD (default build), SIZE (default 1M), SECONDS_PER_RUN (default 2),
#        RANKS (default 2), OUT (write the summary as JSON there)
# Exit: 0 when the cost is <= 1% (or the noise cannot tell, while the
# sampler's CPU share is <= 1%: says so), 1 when above, 77 when shunt-bench
# is missing.
set -u
cd "$(dirname "$0")/.."
reps=${1:-7}
interval=${2:-10}
size=${SIZE:-1M}
secs=${SECONDS_PER_RUN:-2}
ranks=${RANKS:-2}
bench=${BUILD:-build}/bin/shunt-bench
[ -x "$bench" ] || { echo "timeline-cost: $bench not built"; exit 77; }
work=$(mktemp -d /tmp/shunt-timeline-cost.XXXXXX)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done; rm -rf "$work"; }
trap cleanup EXIT

port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# one_run JSON [EXTRA...]: busbw of one run (rank 0's JSON)
one_run() {
  local json=$1; shift
  local p r; p=$(port)
  pids=()
  for ((r = 1; r < ranks; r++)); do
    timeout 60 "$bench" --rank $r --world $ranks --bootstrap 127.0.0.1:$p -b "$size" -e "$size" -w 20 -c 0 \
      --duration "$secs" "$@" >/dev/null 2>&1 &
    pids+=($!)
  done
  timeout 60 "$bench" --rank 0 --world $ranks --bootstrap 127.0.0.1:$p -b "$size" -e "$size" -w 20 -c 0 \
    --duration "$secs" -q -J "$json" "$@" >/dev/null 2>&1 || { echo "timeline-cost: run failed" >&2; exit 2; }
  for r in "${pids[@]}"; do wait "$r"; done
  python3 -c 'import json,sys; j=json.load(open(sys.argv[1])); t=j.get("timeline")
print(j["results"][0]["busbw"], (t["sampler_cpu_s"] / t["samples"][-1][1]) if t else 0)' "$json"
}

off=() on=()
for ((i = 0; i < reps; i++)); do
  # alternate which goes first so drift on a shared machine hits both alike
  if ((i % 2)); then
    on+=("$(one_run "$work/on.json" --timeline "$interval")")
    off+=("$(one_run "$work/off.json")")
  else
    off+=("$(one_run "$work/off.json")")
    on+=("$(one_run "$work/on.json" --timeline "$interval")")
  fi
  echo "pair $((i + 1))/$reps: busbw without ${off[-1]% *} GB/s, with --timeline $interval ${on[-1]% *} GB/s"
done

python3 - "$interval" "${OUT:-}" "${off[*]}" "${on[*]}" <<'PY'
import json, random, statistics, sys
interval, out = int(sys.argv[1]), sys.argv[2]
off = [float(x) for x in sys.argv[3].split()[0::2]]
on_vals = sys.argv[4].split()
on = [float(x) for x in on_vals[0::2]]
cpu_share = statistics.median(float(x) for x in on_vals[1::2])
ratios = [b / a for a, b in zip(off, on)]
ratio = statistics.median(ratios)
random.seed(1)
boot = sorted(statistics.median(random.choices(ratios, k=len(ratios))) for _ in range(2000))
lo, hi = boot[100], boot[1899]
m_off, m_on = statistics.median(off), statistics.median(on)
print(f"timeline-cost: median busbw without {m_off:.3f} GB/s, with --timeline {interval} ms {m_on:.3f} GB/s")
print(f"timeline-cost: ratio with/without {ratio:.4f} (median of {len(ratios)} pairs; 90% interval {lo:.4f}..{hi:.4f})")
print(f"timeline-cost: sampler thread CPU {cpu_share * 100:.3f}% of one core")
if lo > 1.01:
    print("timeline-cost: note: runs with the sampler were faster, most likely because its periodic wakeups keep idle"
          " (v)CPUs from halting, which the poll()-blocking tcp transport feels more than the sampler's cost")
if 1 - ratio <= 0.01:
    verdict, rc = "PASS: cost <= 1%", 0
elif 1 - hi <= 0.01 and cpu_share <= 0.01:
    verdict, rc = "PASS (noisy machine: the pairs cannot resolve 1%, the sampler's CPU share is within it)", 0
else:
    verdict, rc = "FAIL: cost > 1%", 1
print("timeline-cost: " + verdict)
if out:
    json.dump({"bench": "timeline-cost", "interval_ms": interval, "busbw_off": off, "busbw_on": on,
               "pair_ratios": ratios, "ratio": ratio, "ratio_interval90": [lo, hi],
               "sampler_cpu_share": cpu_share, "pass": rc == 0}, open(out, "w"), indent=1)
sys.exit(rc)
PY
