#!/usr/bin/env bash
# A bad value of a variable that decides the data path prints one clear line
# naming the variable and what is allowed; shunt falls back to off and the
# application runs exactly as without it. A bad value of a variable that only
# changes what shunt logs and reports is ignored with one warning, and shunt
# stays on. Words match in any case, integers are decimal, a config file that
# is not a regular file is refused at once, and an echoed value stays on one
# short line.
# timeout: 90
. "$(dirname "$0")/../lib.sh"
# This test's own agent, without an HTTP endpoint: nothing but the settings speaks on stderr.
export SHUNT_RUN_DIR=$TMP/run SHUNT_METRICS_ADDR=off
mkdir -p "$SHUNT_RUN_DIR"
run_pair() {  # VAR=VALUE...: tcp_pair under the preload; $TMP/out, $TMP/err, $rc
  local p what
  p=$(free_port)
  what=$(printf '%.80s' "$*")
  "$B/test/tcp_pair" server "$p" & local srv=$!
  rm -f "$TMP/bad.json"
  timeout 20 env "$@" SHUNT_STATS_FILE="$TMP/bad.json" LD_PRELOAD=$LIB "$B/test/tcp_pair" client "$p" \
    > "$TMP/out" 2> "$TMP/err"
  rc=$?
  kill $srv 2>/dev/null
  wait $srv
  expect_eq "$rc" 0 "exit status with $what"
  expect_eq "$(cat "$TMP/out")" "client: 12000 bytes each way" "output with $what"
}
check() {  # VAR=VALUE EXPECTED-LINE-FRAGMENT: shunt turns off
  local assign=$1 want=$2 what
  what=$(printf '%.80s' "$assign")
  run_pair "$assign"
  expect_eq "$(wc -l < "$TMP/err")" 1 "lines on stderr with $what"
  grep -qF -- "$want" "$TMP/err" || fail "message for $what: $(head -c 1000 "$TMP/err")"
  grep -q "shunt is off for this process" "$TMP/err" || fail "no fallback notice"
  [ -e "$TMP/bad.json" ] && fail "stats written although shunt is off"
  ok "$what: $(cat "$TMP/err")"
}
check_on() {  # VAR=VALUE... MODE: shunt stays on in MODE (its stats file says so)
  local mode=${*: -1}
  run_pair "${@:1:$#-1}"
  grep -q "shunt is off" "$TMP/err" && fail "shunt turned off with ${*:1:$#-1}: $(cat "$TMP/err")"
  [ -e "$TMP/bad.json" ] || fail "no stats written with ${*:1:$#-1}: shunt was off"
  expect_eq "$(jget "$TMP/bad.json" 'd["mode"]')" "$mode" "mode with ${*:1:$#-1}"
}
check SHUNT_MODE=bogus "SHUNT_MODE='bogus' is not a known value: expected one of off, observe or active"
# An integer variable of the data path out of range and not a number, whichever the registry has.
int_var=$("$B/bin/shuntctl" config --json | python3 -c 'import json,sys; print([v["name"]+" "+v["allowed"] for v in json.load(sys.stdin)["variables"] if v["type"]=="int" and v["scope"]=="data"][0])')
name=${int_var% *} range=${int_var#* }
max=${range#*..}
check "$name=$((max + 1))" "$name='$((max + 1))' is out of range: expected an integer from ${range%..*} to $max"
check "$name=12abc" "$name='12abc' is not a decimal number"
check "$name=0x10" "$name='0x10' is not a decimal number"
conf=$TMP/shunt.conf
echo "SHUNT_MODE=sideways" > "$conf"
check SHUNT_CONF_FILE="$conf" "SHUNT_MODE='sideways' (from $conf:1) is not a known value"

# Log level, metrics interval: reporting only, so the default stands, with one warning.
check_on SHUNT_LOG_LEVEL=9 active
expect_eq "$(wc -l < "$TMP/err")" 1 "lines on stderr with SHUNT_LOG_LEVEL=9"
grep -qF "SHUNT_LOG_LEVEL='9' is not a known value: expected one of trace, debug, info, warn, error or off; using 'warn' instead" \
  "$TMP/err" || fail "warning for SHUNT_LOG_LEVEL=9: $(cat "$TMP/err")"
ok "SHUNT_LOG_LEVEL=9: $(cat "$TMP/err")"
check_on SHUNT_METRICS_INTERVAL_MS=fast SHUNT_MODE=observe observe
grep -qF "SHUNT_METRICS_INTERVAL_MS='fast'" "$TMP/err" || fail "no warning naming SHUNT_METRICS_INTERVAL_MS"
# Words in any case, switches as 0/1, empty as unset.
check_on SHUNT_LOG_LEVEL=INFO active
grep -q "shunt info: shunt .* mode active" "$TMP/err" || fail "SHUNT_LOG_LEVEL=INFO did not log at info: $(cat "$TMP/err")"
check_on SHUNT_MODE=OBSERVE observe
check_on SHUNT_AGENT=0 active
check_on SHUNT_MODE= active

# A 50 KB value is echoed cut, on one line, with its length.
long=$(head -c 51200 /dev/zero | tr '\0' x)
check SHUNT_MODE="$long" "SHUNT_MODE='$(head -c 100 /dev/zero | tr '\0' x)'... (51200 bytes) is not a known value"
[ "$(wc -c < "$TMP/err")" -lt 400 ] || fail "the echo of a 50 KB value is $(wc -c < "$TMP/err") bytes"
# A newline in a value does not start a second line.
check SHUNT_MODE=$'act\nive' "SHUNT_MODE='act\\nive' is not a known value"

# A config file that is not a regular file is refused at once: it is never
# read (a FIFO would block the program, /dev/zero would never end).
mkdir "$TMP/conf.d"
mkfifo "$TMP/conf.fifo"
for f in "$TMP/conf.d:a directory" "$TMP/conf.fifo:a FIFO" "/dev/zero:a character device" "/dev/urandom:a character device"; do
  start=$(date +%s%N)
  check SHUNT_CONF_FILE="${f%%:*}" "SHUNT_CONF_FILE='${f%%:*}' is ${f#*:}, not a regular file"
  took=$((($(date +%s%N) - start) / 1000000))
  ok "refused in $took ms"
done

# SHUNT_PEER_PORT=0PORT is PORT (not octal): the peer channel listens there.
port=$(free_port)
SHUNT_MODE=observe SHUNT_PEER_ADDR=127.0.0.1 SHUNT_PEER_PORT=0$port SHUNT_JOB_KEY=k \
  SHUNT_LOG_LEVEL=info SHUNT_LOG_FILE="$TMP/agent.log" LD_PRELOAD=$LIB "$B/test/hold_socket" 20000 &
agent=$!
at_exit "kill $agent 2>/dev/null"
for i in $(seq 1 50); do grep -q "peer channel: listening" "$TMP/agent.log" 2>/dev/null && break; sleep 0.1; done
grep -q "peer channel: listening on 127.0.0.1:$port\$" "$TMP/agent.log" ||
  fail "SHUNT_PEER_PORT=0$port: $(cat "$TMP/agent.log" 2>/dev/null)"
ok "SHUNT_PEER_PORT=0$port listens on $port"
