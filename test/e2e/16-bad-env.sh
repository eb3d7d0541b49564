#!/usr/bin/env bash
# A bad value prints one clear line naming the variable and what is allowed;
# shunt falls back to off and the application runs exactly as without it.
# timeout: 60
. "$(dirname "$0")/../lib.sh"
port=$(free_port)
check() {  # VAR=VALUE EXPECTED-LINE-FRAGMENT
  local assign=$1 want=$2 p
  p=$(free_port)
  "$B/test/tcp_pair" server "$p" & local srv=$!
  env "$assign" SHUNT_STATS_FILE="$TMP/bad.json" LD_PRELOAD=$LIB "$B/test/tcp_pair" client "$p" \
    > "$TMP/out" 2> "$TMP/err"
  local rc=$?
  wait $srv
  expect_eq "$rc" 0 "exit status with $assign"
  expect_eq "$(cat "$TMP/out")" "client: 12000 bytes each way" "output with $assign"
  expect_eq "$(wc -l < "$TMP/err")" 1 "lines on stderr with $assign"
  grep -qF -- "$want" "$TMP/err" || fail "message for $assign: $(cat "$TMP/err")"
  grep -q "shunt is off for this process" "$TMP/err" || fail "no fallback notice"
  [ -e "$TMP/bad.json" ] && fail "stats written although shunt is off"
  ok "$assign: $(cat "$TMP/err")"
}
check SHUNT_MODE=bogus "SHUNT_MODE='bogus' is not a known value: expected one of off, observe or active"
check SHUNT_LOG_LEVEL=9 "SHUNT_LOG_LEVEL='9' is not a known value: expected one of trace, debug, info, warn, error or off"
# An integer variable out of range and not a number, whichever the registry has.
int_var=$("$B/bin/shuntctl" config --json | python3 -c 'import json,sys; print([v["name"]+" "+v["allowed"] for v in json.load(sys.stdin)["variables"] if v["type"]=="int"][0])')
name=${int_var% *} range=${int_var#* }
max=${range#*..}
check "$name=$((max + 1))" "$name='$((max + 1))' is out of range: expected an integer from ${range%..*} to $max"
check "$name=12abc" "$name='12abc' is not a number"
conf=$TMP/shunt.conf
echo "SHUNT_MODE=sideways" > "$conf"
check SHUNT_CONF_FILE="$conf" "SHUNT_MODE='sideways' (from $conf:1) is not a known value"
