#!/usr/bin/env bash
# timeout: 300
# Teardown: 15 cycles of create -> connect (two RC QPs of one process,
# looped back through the device) -> bundle -> RDMA WRITEs checked byte for
# byte and completion by completion -> destroy, under active shunt. The
# device's object counts (rdma resource) after the cycles equal those
# before: every shadow QP went with its application QP. Also: a bundle
# between two QPs of the same process, found through the host's agent.
. "$(dirname "$0")/lib.sh"
need_guests
PROG=$B/test/bundle_cycles
[ -x "$PROG" ] || fail "no $PROG (make)"
up --hosts 1 --rails 1 --spines 1
gexec h1 env LD_PRELOAD="$LIB" SHUNT_MODE=active SHUNT_SPREAD=flowlet SHUNT_JOB_KEY=cycles-$$ SHUNT_PATHS_PER_RAIL=4 \
  SHUNT_LOG_LEVEL=info SHUNT_STATS_FILE=/tmp/cycles.json "$PROG" rxe0 1 15 40 1500 > "$TMP/out" 2>&1 ||
  { cat "$TMP/out"; fail "bundle_cycles failed"; }
cat "$TMP/out" | grep -v "shunt info: peer channel\|host agent\|metrics:"
before=$(sed -n 's/^before: //p' "$TMP/out")
after=$(sed -n 's/^after: //p' "$TMP/out")
[ -n "$before" ] && [ "$before" = "$after" ] || fail "device objects before ($before) and after ($after) differ"
active=$(grep -c "bundle active with 4 shadow paths" "$TMP/out")
echo "bundles active: $active (of 30 QPs, both ends of 15 pairs)"
[ "$active" -ge 20 ] || fail "only $active of 30 QPs got a bundle"
fab exec h1 -- cat /tmp/cycles.json > "$TMP/cycles.json"
shadow_wrs=$(jget "$TMP/cycles.json" 'sum(q["send_wrs"].get("RDMA_WRITE", 0) for q in d["verbs"]["qps"] if "shadow_of" in q)')
echo "WRITEs that rode shadow QPs: $shadow_wrs of 600"
[ "$shadow_wrs" -gt 0 ] || fail "no WRITE rode a shadow"
left=$(jget "$TMP/cycles.json" 'len([q for q in d["verbs"]["qps"] if not q["destroyed"]])')
[ "$left" = 0 ] || fail "$left QP records not destroyed"
echo ok
