#!/usr/bin/env bash
# Failover on the fabric: `shunt-bench scenario blackhole --link l1r0-s1`
# (h1's rail-0 leaf loses its uplink to spine s1 silently for 10 s), with 2
# and with 4 ranks, each run without and with libshunt side by side.
# Reported per case: how each run ended, the time from the fault until
# throughput is back to 90% of before, the longest stretch of zero
# throughput, and throughput before, during and after the fault.
set -u
cd "$(dirname "$0")/.."
B=${BUILD:-build}
case $B in /*) ;; *) B=$PWD/$B ;; esac
export SHUNT_FABRIC_GUEST=${SHUNT_FABRIC_GUEST:-$B/guest}
out=$B/bench/failover
mkdir -p "$out"
rc=0
for ranks in 2 4; do
  "$B/bin/shunt-bench" scenario blackhole --link l1r0-s1 --ranks $ranks --duration 30 --out "$out/r$ranks" \
    > "$out/r$ranks.log" 2>&1
  c=$?
  [ $c = 77 ] && { tail -1 "$out/r$ranks.log"; exit 0; }
  [ $c = 0 ] || { cat "$out/r$ranks.log"; rc=1; }
done
python3 - "$out" <<'PY'
import json, sys
out = sys.argv[1]
rows = ["exit status", "errors seen by the app", "bytes wrong", "time to recover", "longest zero-throughput",
        "GB/s before the fault", "GB/s during the fault", "GB/s after healing"]
print(f"{'blackhole l1r0-s1, 10 s':<26}" + "".join(f"{h:<22}" for h in
      ("2 ranks without", "2 ranks with", "4 ranks without", "4 ranks with")))
s = {r: json.load(open(f"{out}/r{r}/summary.json")) for r in (2, 4)}
for k in rows:
    print(f"{k:<26}" + "".join(f"{str(s[r][m].get(k, '-'))[:21]:<22}" for r in (2, 4) for m in ("without", "with")))
PY
exit $rc
