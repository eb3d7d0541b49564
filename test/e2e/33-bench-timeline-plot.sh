#!/usr/bin/env bash
# timeout: 90
# --duration runs by time, --timeline prints per-interval throughput rows
# with wall time, --plot draws them (PNG and SVG) with marks, the JSON keeps
# the samples, and `shunt-bench plot` redraws two saved runs together.
set -u
. "$(dirname "$0")/bench-lib.sh"
command -v gnuplot >/dev/null || { echo "gnuplot not installed"; exit 77; }

out=$WORK/tl.out
now=$(date +%s)
echo "1.5:from-file" >"$WORK/marks"
start=$(date +%s.%N)
run_ranks 2 "$out" --transport tcp -b 256K -e 256K --duration 3 --timeline 200 --plot "$WORK/tl.png" \
  --mark 1:one --mark "@$((now + 2)):two" --marks-file "$WORK/marks" -J "$WORK/tl.json" --label baseline \
  --timeline-file "$WORK/tl.tsv" || { cat "$out" "$WORK"/rank0.err; fail "timeline run exited $?"; }
took=$(python3 -c "import time; print(time.time() - $start)")
cat "$out"
python3 -c "import sys; t=float(sys.argv[1]); assert 3 <= t < 15, t" "$took" || fail "--duration 3 took ${took}s"
n=$(grep -c '^#T  *[0-9]' "$out")
[ "$n" -ge 12 ] && [ "$n" -le 20 ] || fail "expected ~15 timeline rows at 200 ms over 3 s, got $n"
# Every row but the last has throughput; the last is the part interval up to
# the stop (a few ms), where the ranks may have delivered nothing.
grep '^#T  *[0-9]' "$out" | awk -v now=$now '$2 < now - 5 || $2 > now + 30 || idle { bad = 1 } { idle = $5 <= 0 } END { exit bad }' ||
  fail "timeline rows need a wall time near now, and all but the last positive throughput"
[ "$(grep -c '^#T  *[0-9]' "$WORK/tl.tsv")" = "$n" ] || fail "--timeline-file rows differ"
[ "$(rows "$out" | wc -l)" = 1 ] || fail "one size, one row"
rows "$out" | awk '$9 == 0 && $7 > 0 { ok = 1 } END { exit !ok }' || fail "row without throughput"
head -c 8 "$WORK/tl.png" | od -An -c | grep -q 'P   N   G' || fail "no PNG written"
python3 - "$WORK/tl.json" <<'PY' || fail "JSON timeline"
import json, sys
j = json.load(open(sys.argv[1]))
tl = j["timeline"]; s = tl["samples"]
assert tl["interval_ms"] == 200 and len(s) >= 12 and j["label"] == "baseline"
assert sum(x[2] for x in s) > 0
assert [m["label"] for m in j["marks"]] == ["one", "two", "from-file"], j["marks"]
assert abs(j["marks"][1]["t"] - (int(j["marks"][1]["t"]) + 0)) >= 0  # absolute mark made relative
assert -5 < j["marks"][1]["t"] < 10
PY
cp "$WORK/tl.json" "$WORK/tl2.json"
"$BENCH" plot -o "$WORK/both.svg" --title "two runs" --mark 2:fault "$WORK/tl.json" "$WORK/tl2.json" ||
  fail "plot subcommand failed"
grep -q '<svg' "$WORK/both.svg" || fail "no SVG written"
grep -q 'fault' "$WORK/both.svg" || fail "mark label missing from the SVG"
"$BENCH" --plot "$WORK/x.png" >/dev/null 2>&1 && fail "--plot without --timeline must be refused"
echo ok
