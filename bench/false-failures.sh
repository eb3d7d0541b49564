#!/usr/bin/env bash
# Path failures with no fault, on soft-RoCE guests that share the host's
# cores: every one of them is false (a replay and a renewal, or a carrier
# move, that nobody needed). FF_HOSTS guests (default 4), one rail, two
# spines, nothing injected; a shunt-bench all-to-all (1 MiB WRITE_WITH_IMM,
# 256 KiB WRs, -c 1) for FF_SECONDS (default 60) in each spreading mode of
# FF_MODES (default "pin flowlet split"), libshunt's defaults otherwise.
# Reported per mode: the application's errors, path failures by what found
# them (lost probes, a stall, an error completion), replays, and failures
# per path-hour (paths: every bundle's application QP and shadows, summed
# over the ranks, times the run's length). Also how busy rank 0's guest
# was: the guests' CPU is what limits here.
SHUNT_ROOT=$(cd "$(dirname "$0")/.." && pwd)
. "$SHUNT_ROOT/test/fabric/lib.sh"
need_guests
BENCH=$B/bin/shunt-bench
HOSTS=${FF_HOSTS:-4}
DUR=${FF_SECONDS:-60}
MODES=${FF_MODES:-pin flowlet split}
up --hosts "$HOSTS" --rails 1 --spines 2

# run MODE: the all-to-all with SHUNT_SPREAD=MODE; its files in $TMP/MODE.*
run() {
  local mode=$1 r pids=() port=$((30000 + RANDOM % 2000)) key=ff-$RANDOM-$RANDOM
  local args=(--world "$HOSTS" --bootstrap "$(fab addr h1 r0):$port" --transport verbs --verb write_imm -d rxe0
    -b 1M -e 1M -w 1 --duration "$DUR" -c 1 --seg 256K --stall-timeout 60 --qp-timeout 18)
  fab exec h1 -- bash "$SHUNT_ROOT/bench/thread-cpu.sh" shunt-bench $((DUR / 3)) $((DUR / 2)) > "$TMP/$mode.cpu" 2>&1 &
  local cpu=$!
  for ((r = HOSTS - 1; r >= 0; r--)); do
    fab exec h$((r + 1)) -- sh -c 'rm -f /tmp/ff-events.jsonl /tmp/ff-stats.json; exec "$@"' sh \
      timeout $((DUR + 120)) env LD_PRELOAD="$LIB" SHUNT_JOB_KEY="$key" SHUNT_SPREAD="$mode" \
      SHUNT_EVENT_LOG=/tmp/ff-events.jsonl SHUNT_STATS_FILE=/tmp/ff-stats.json \
      "$BENCH" --rank $r "${args[@]}" > "$TMP/$mode.rank$r" 2>&1 &
    pids+=($!)
  done
  local p
  for p in "${pids[@]}"; do wait "$p"; done
  wait "$cpu"
  for ((r = 0; r < HOSTS; r++)); do
    fab exec h$((r + 1)) -- cat /tmp/ff-events.jsonl > "$TMP/$mode.events$r" 2>/dev/null
    fab exec h$((r + 1)) -- cat /tmp/ff-stats.json > "$TMP/$mode.stats$r" 2>/dev/null
  done
}

report() {
  python3 - "$TMP" "$1" "$HOSTS" "$DUR" <<'PY'
import collections, json, re, sys
tmp, mode, hosts, dur = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
by = collections.Counter()
paths = replays = errors = 0
failed = []
for r in range(hosts):
    for line in open(f"{tmp}/{mode}.events{r}", errors="replace"):
        try:
            e = json.loads(line)
        except ValueError:
            continue
        if e.get("event") == "path_down" and e.get("path") is not None and "->" not in str(e.get("path")):
            by[e.get("status") or "other"] += 1
    out = open(f"{tmp}/{mode}.rank{r}", errors="replace").read()
    # rank 0 prints the summary; every rank prints its errors
    m = re.search(r"Errors seen\s*:\s*(\d+)", out)
    if r == 0 and not m:
        failed.append("rank 0: no summary: " + (out.strip().splitlines() or ["no output"])[-1][:160])
    errors += int(m.group(1)) if m else 0
    if r > 0:
        errors += len(re.findall(r"^shunt-bench: rank \d+: error:", out, re.M))
    try:
        s = json.load(open(f"{tmp}/{mode}.stats{r}"))
    except (OSError, ValueError):
        failed.append(f"rank {r}: no stats file")
        continue
    replays += s.get("replays", 0)
    # written at exit: every bundle is closed by then, each path counted once per bundle
    paths += sum(q.get("bundles", 0) for q in s.get("closed_bundle_paths", []))
n = sum(by.values())
per = n / (paths * dur / 3600) if paths else float("nan")
detail = ", ".join(f"{k} {v}" for k, v in sorted(by.items())) or "none"
print(f"{mode:8s} app errors {errors}  path failures {n} ({detail})  replays {replays}  "
      f"paths {paths}  per path-hour {per:.1f}")
for f in failed:
    print(f"         did not run to its end: {f}")
PY
  awk '/^helpers/ { print "         rank 0 guest busy " ($6 == "" ? "?" : 100 - int(100 * $6 / $4)) "%" }' "$TMP/$1.cpu"
}

for mode in $MODES; do run "$mode"; done
echo "false failures: $HOSTS guests, 1 rail, 2 spines, no fault, ${DUR} s per mode"
for mode in $MODES; do report "$mode"; done
