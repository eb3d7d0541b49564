#!/usr/bin/env bash
# timeout: 300
# `shunt-bench scenario blackhole` as a new user runs it: no --probes and
# no SHUNT_* variable but the job key the scenario sets (as shunt-run
# does). The run with libshunt rides out the silent fault and its paths are
# found down by their lost probes (the agents' probe engines run on the
# rails found behind the guests' RoCE ports). ACK timeout 268 ms, retry count 7:
# retransmissions would report the fault after ~2 s, the probes within ~1 s.
. "$(dirname "$0")/lib.sh"
need_guests
BIN=$ROOT/${BUILD:-build}/bin
case $BIN in /*) ;; *) BIN=$ROOT/$BIN ;; esac
[ -x "$BIN/shunt-bench" ] && [ -x "$BIN/shunt-bench-scenario" ] || skip "shunt-bench not built"
while IFS= read -r v; do
  case $v in SHUNT_FABRIC_*|SHUNT_ROOT|SHUNT_BENCH*) ;; SHUNT_*) unset "$v" ;; esac
done < <(compgen -e)
"$BIN/shunt-bench" scenario blackhole --link l1r0-s1 --duration 16 --fault-at 7 --fault-for 4 --stall 20 \
  --retry-cnt 7 --qp-timeout 16 --out "$TMP/sc" >"$TMP/sc.out" 2>&1 || { cat "$TMP/sc.out"; fail "scenario exited $?"; }
cat "$TMP/sc.out"
python3 - "$TMP/sc/summary.json" <<'PY' || fail "scenario results"
import json, sys
w = json.load(open(sys.argv[1]))["with"]
assert w["exit status"] == "0" and w["errors seen by the app"] == "0", w
assert int(w["paths down by probes"]) >= 1, w
print("ok:", w["paths down by probes"], "paths found down by their lost probes; the first path down after",
      w["path down after"], "by", w["path found down by"])
PY
