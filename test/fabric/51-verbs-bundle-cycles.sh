#!/usr/bin/env bash
# timeout: 300
# Teardown: 15 cycles of create -> connect (two RC QPs of one process,
# looped back through the device) -> bundle -> RDMA WRITEs checked byte for
# byte and completion by completion -> destroy, under active shunt. The
# devices' object counts (rdma resource) after the cycles equal those
# before: every shadow QP went with its application QP, and on the other
# NIC (rxe1, where each bundle also has paths) every mirror PD, MR, CQ and
# QP went with the application's PD, MR, CQ and QP (shunt's own context
# there stays open: contexts are not compared). Also: a bundle between two
# QPs of the same process, found through the host's agent.
. "$(dirname "$0")/lib.sh"
need_guests
PROG=$B/test/bundle_cycles
[ -x "$PROG" ] || fail "no $PROG (make)"
up --hosts 1 --rails 2 --spines 1
gexec h1 env LD_PRELOAD="$LIB" SHUNT_MODE=active SHUNT_SPREAD=flowlet SHUNT_JOB_KEY=cycles-$$ SHUNT_PATHS_PER_RAIL=4 \
  SHUNT_LOG_LEVEL=info SHUNT_STATS_FILE=/tmp/cycles.json "$PROG" rxe0 1 15 40 1500 > "$TMP/out" 2>&1 ||
  { cat "$TMP/out"; fail "bundle_cycles failed"; }
cat "$TMP/out" | grep -v "shunt info: peer channel\|host agent\|metrics:"
before=$(sed -n 's/^before: //p' "$TMP/out" | sed 's/ ctx [0-9]*//')
after=$(sed -n 's/^after: //p' "$TMP/out" | sed 's/ ctx [0-9]*//')
[ "$(echo "$before" | wc -l)" = 2 ] || fail "want the counts of rxe0 and rxe1, got: $before"
[ -n "$before" ] && [ "$before" = "$after" ] || fail "device objects before ($before) and after ($after) differ"
railed=$(grep -c "bundle active with 4 shadow paths (UDP source ports [0-9,]*) and 4 on other NICs (rxe1: " "$TMP/out")
echo "bundles with paths on rxe1: $railed"
[ "$railed" -ge 20 ] || fail "only $railed bundles had paths on rxe1"
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
