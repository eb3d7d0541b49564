#!/usr/bin/env bash
# timeout: 120
# alltoall over tcp on loopback at 2 and 4 ranks: every received byte
# checked (#wrong 0), nccl-tests columns and footer, busbw = algbw (n-1)/n,
# and -J writes JSON that parses and agrees with the table.
set -u
. "$(dirname "$0")/bench-lib.sh"

for n in 2 4; do
  out=$WORK/a2a-$n.out
  run_ranks $n "$out" --transport tcp -b 1K -e 4M -f 4 -n 5 -w 2 -c 1 -J "$WORK/a2a-$n.json" ||
    { cat "$out" "$WORK"/rank0.err; fail "alltoall at $n ranks exited $?"; }
  for rc in "${RANK_RCS[@]}"; do [ "$rc" = 0 ] || fail "a rank exited $rc"; done
  cat "$out"
  grep -Eq '^#[[:space:]]+size[[:space:]]+count[[:space:]]+type[[:space:]]+redop[[:space:]]+root[[:space:]]+time[[:space:]]+algbw[[:space:]]+busbw[[:space:]]+#wrong' "$out" ||
    fail "column header missing"
  grep -q '^# Avg bus bandwidth *: [0-9.e+-]*$' "$out" || fail "Avg bus bandwidth footer missing"
  grep -q '^# Out of bounds values : 0 OK' "$out" || fail "check footer missing"
  expect_wrong "$out" 0
  [ "$(rows "$out" | wc -l)" = 7 ] || fail "expected 7 sizes (1K..4M by 4)"
  rows "$out" | awk -v n=$n '{ want = $7 * (n - 1) / n; d = $8 - want; if (d < 0) d = -d;
      if ($3 != "uint8" || $4 != "none" || $5 != -1 || d > 0.0015) { print "bad: " $0; bad = 1 } } END { exit bad }' ||
    fail "busbw is not algbw*(n-1)/n"
  python3 -m json.tool "$WORK/a2a-$n.json" >/dev/null || fail "JSON does not parse"
  python3 - "$WORK/a2a-$n.json" $n <<'PY' || fail "JSON content"
import json, sys
j = json.load(open(sys.argv[1])); n = int(sys.argv[2])
assert j["pattern"] == "alltoall" and j["world"] == n and j["transport"] == "tcp", j
assert len(j["results"]) == 7 and j["wrong_total"] == 0 and j["errors"] == 0 and j["error"] is None
for r in j["results"]:
    assert r["wrong"] == 0 and r["size"] % n == 0 and r["time_us"] > 0
    assert abs(r["busbw"] - r["algbw"] * (n - 1) / n) < 1e-9
    assert abs(r["algbw"] - r["size"] / r["time_us"] / 1e3) <= 1e-6 * r["algbw"]
assert len(j["ranks"]) == n
PY
done
echo "ok"
