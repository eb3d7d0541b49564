#!/usr/bin/env bash
# The job's step rhythm, found with no help from the application (part of
# `make bench`, not of `make test`: on guests starved enough that a rank's
# steps vary by a tenth, the estimates' confidence is 0.40-0.58, at the
# bound of 0.4, and a rank is missing from the view now and then): a 4-rank
# verbs all-to-all on four guests (one rail, two spines, libshunt's
# defaults) in which each iteration is followed by 400 ms of sleep, as a
# training step's compute. While it runs, the job-wide `shuntctl diagnose`
# (asked on h2, so through every host's agent) lists a step for each of the
# four ranks, within 20% of the step the job itself measured (its run time
# over its iterations), and its plain output says it; `diagnose --watch
# --plot` draws the four ranks' steps. Every byte is right.
SHUNT_ROOT=$(cd "$(dirname "$0")/.." && pwd)
. "$SHUNT_ROOT/test/fabric/lib.sh"
need_guests
BENCH=$B/bin/shunt-bench
CTL=$B/bin/shuntctl
while IFS= read -r v; do
  case $v in SHUNT_FABRIC_*|SHUNT_ROOT|SHUNT_TEST_*) ;; SHUNT_*) unset "$v" ;; esac
done < <(compgen -e)
up --hosts 4 --rails 1 --spines 2
KEY=step-$$ DUR=40
a1=$(fab addr h1 r0)
pids=()
for r in 1 2 3 0; do
  fab exec "h$((r + 1))" -- timeout 200 env LD_PRELOAD="$LIB" SHUNT_JOB_KEY="$KEY" \
    "$BENCH" --rank $r --world 4 --bootstrap "$a1:29915" --transport verbs -d rxe0 --verb write_imm \
    -b 256K -e 256K -w 2 -c 1 --duration $DUR --compute-ms 400 --qp-timeout 18 -J /tmp/step.json \
    > "$TMP/rank$r.out" 2>&1 &
  pids+=($!)
done

# Until every rank shows a step (the rhythm needs a few seconds of history).
t0=$SECONDS got=
while [ $((SECONDS - t0)) -lt $((DUR + 10)) ]; do
  sleep 3
  fab exec h2 -- env SHUNT_JOB_KEY="$KEY" timeout 20 "$CTL" diagnose --json > "$TMP/d.json" 2> "$TMP/d.err" || continue
  n=$(jget "$TMP/d.json" 'sum(len(h.get("steps", [])) for h in d["hosts"])' 2>/dev/null) || continue
  if [ "$n" -ge 4 ]; then
    got=$((SECONDS - t0))
    fab exec h2 -- env SHUNT_JOB_KEY="$KEY" timeout 20 "$CTL" diagnose > "$TMP/d.txt" 2>&1
    fab exec h2 -- env SHUNT_JOB_KEY="$KEY" timeout 30 "$CTL" diagnose --watch 4 --plot /tmp/step.svg > "$TMP/w.txt" 2>&1
    fab exec h2 -- cat /tmp/step.svg > "$TMP/step.svg" 2>/dev/null
    break
  fi
done
for p in "${pids[@]}"; do wait "$p" || fail "a rank failed: $(cat "$TMP"/rank*.out | tail -20)"; done
[ -n "$got" ] || { cat "$TMP/d.json" "$TMP/d.err"; fail "not every rank showed a step within $((DUR + 10)) s"; }
note "every rank showed a step $got s after the start"
fab exec h1 -- cat /tmp/step.json > "$TMP/step.json" || fail "no results from rank 0"
wrong=$(jget "$TMP/step.json" 'd["results"][0]["wrong"]')
[ "$wrong" = 0 ] || fail "#wrong $wrong"
python3 - "$TMP/step.json" "$TMP/d.json" <<'PY' || fail "the steps found are not the job's"
import json, sys
res = json.load(open(sys.argv[1]))
r = res["results"][0]
step = res["options"]["duration_s"] * 1e3 / r["iters"]
print("the job: %d iterations in %.0f s: %.0f ms a step (%.0f ms of it the timed all-to-all)"
      % (r["iters"], res["options"]["duration_s"], step, r["time_us"] / 1e3))
bad = []
for h in json.load(open(sys.argv[2]))["hosts"]:
    for s in h.get("steps", []):
        print("  %s rank %s: %.0f ms, sure %.2f, communicating %.0f%%"
              % (h.get("host"), s.get("rank"), s["period_ms"], s["confidence"], 100 * s["comm_share"]))
        if abs(s["period_ms"] - step) > 0.2 * step:
            bad.append(s)
sys.exit(1 if bad else 0)
PY
grep -q "^step: " "$TMP/d.txt" || { cat "$TMP/d.txt"; fail "shuntctl diagnose's plain output has no step line"; }
grep "^step: " "$TMP/d.txt"
cat "$TMP/w.txt"
# Each rank's step in the watch's lines (on guests slow enough that a
# rank's steps vary by a tenth, a rank's estimate is near its confidence
# bound and may be missing from a line or two).
[ "$(grep -E 'steps \(ms\):' "$TMP/w.txt" | grep -Eo ' h[1-4]/[0-9]+:[0-9]+' | cut -d/ -f1 | sort -u | wc -l)" -ge 4 ] ||
  fail "diagnose --watch did not show each of the four ranks' steps"
[ "$(grep -Eo '>h[1-4]/[^<]*<' "$TMP/step.svg" | sort -u | wc -l)" -ge 4 ] || fail "the watch's plot lacks a rank's step line"
echo "PASS: the step rhythm of every rank, $got s after the start"
