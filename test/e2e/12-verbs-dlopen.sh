#!/usr/bin/env bash
# The NCCL way: dlopen() a verbs library named by a variable, then
# dlvsym(..., "IBVERBS_1.1"). Naming libshunt.so routes the calls through
# shunt without LD_PRELOAD; naming libibverbs does not.
# timeout: 30
. "$(dirname "$0")/../lib.sh"
prog=$B/examples/verbs_dlopen
VERBS_LIB=libibverbs.so.1 SHUNT_STATS_FILE="$TMP/real-%p.json" "$prog" > "$TMP/real.out" 2>&1; real_rc=$?
ls "$TMP"/real-*.json 2>/dev/null && fail "shunt ran although libibverbs was loaded"

VERBS_LIB=$LIB SHUNT_MODE=observe SHUNT_STATS_FILE="$TMP/shunt-%p.json" "$prog" > "$TMP/shunt.out" 2>&1
expect_eq "$?" "$real_rc" "exit status through libshunt"
sed "s#$LIB#libibverbs.so.1#" "$TMP/shunt.out" | diff "$TMP/real.out" - || fail "output differs"
f=$(ls "$TMP"/shunt-*.json) || fail "no stats file: the dlopen'd libshunt did not run"
expect_eq "$(jget "$f" 'd["verbs"]["calls"].get("ibv_get_device_list", 0)')" 1 "calls through dlvsym"
