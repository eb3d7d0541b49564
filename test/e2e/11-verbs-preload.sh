#!/usr/bin/env bash
# A normally linked verbs program reaches shunt's wrappers under LD_PRELOAD,
# behaves exactly as without it, and SHUNT_MODE=off leaves no trace.
# timeout: 30
. "$(dirname "$0")/../lib.sh"
prog=$B/examples/verbs_devices
"$prog" > "$TMP/plain.out" 2> "$TMP/plain.err"; plain_rc=$?

SHUNT_MODE=observe SHUNT_STATS_FILE="$TMP/obs-%p.json" LD_PRELOAD=$LIB "$prog" > "$TMP/obs.out" 2> "$TMP/obs.err"
expect_eq "$?" "$plain_rc" "exit status under observe"
diff "$TMP/plain.out" "$TMP/obs.out" || fail "stdout changed under observe"
diff "$TMP/plain.err" "$TMP/obs.err" || fail "stderr changed under observe"
f=$(ls "$TMP"/obs-*.json) || fail "no stats file"
expect_eq "$(jget "$f" 'd["verbs"]["calls"].get("ibv_get_device_list", 0)')" 1 "ibv_get_device_list calls seen"
expect_eq "$(jget "$f" 'd["mode"]')" observe "mode"

SHUNT_MODE=off SHUNT_LOG_LEVEL=trace SHUNT_STATS_FILE="$TMP/off-%p.json" LD_PRELOAD=$LIB "$prog" > "$TMP/off.out" 2> "$TMP/off.err"
expect_eq "$?" "$plain_rc" "exit status under off"
diff "$TMP/plain.out" "$TMP/off.out" || fail "stdout changed under off"
grep -v ' shunt ' "$TMP/off.err" | diff "$TMP/plain.err" - || fail "stderr changed under off"
ls "$TMP"/off-*.json 2>/dev/null && fail "off mode wrote a stats file"
ok "off mode is pass-through"
