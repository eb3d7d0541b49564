#!/usr/bin/env bash
# A process where shunt turned itself off over a bad setting is visible to
# the operator, not only on its own stderr: shuntctl status lists it in mode
# off with the reason, the host's metrics count it under
# shunt_process_mode{mode="off"}, and it shows as exited once it ends.
# timeout: 60
. "$(dirname "$0")/../lib.sh"
mport=$(free_port)
export SHUNT_RUN_DIR=$TMP/run SHUNT_REPORT_INTERVAL_MS=200 SHUNT_METRICS_ADDR=127.0.0.1:$mport
mkdir -p "$SHUNT_RUN_DIR"
scrape() { python3 -c 'import sys, urllib.request; sys.stdout.write(urllib.request.urlopen(sys.argv[1], timeout=5).read().decode())' \
  "http://127.0.0.1:$mport/metrics"; }

SHUNT_MODE=observe LD_PRELOAD=$LIB "$B/test/hold_socket" 40000 & agent=$!
at_exit "kill $agent 2>/dev/null"
for i in $(seq 100); do scrape > "$TMP/m0" 2>/dev/null && break; sleep 0.1; done
grep -q '^shunt_build_info{' "$TMP/m0" || fail "no agent serving /metrics on port $mport"
ok "agent $agent up"

RANK=7 SHUNT_MODE=fats LD_PRELOAD=$LIB "$B/test/hold_socket" 4000 2> "$TMP/off.err" & off=$!
at_exit "kill $off 2>/dev/null"
for i in $(seq 30); do
  "$B/bin/shuntctl" status > "$TMP/status" 2>&1
  grep -q "^$off " "$TMP/status" && break
  sleep 0.1
done
cat "$TMP/status"
grep -Eq "^$off +off +.* running " "$TMP/status" || fail "shuntctl status does not list $off as off and running"
grep -qF "pid $off: shunt is off: SHUNT_MODE='fats' is not a known value: expected one of off, observe or active" \
  "$TMP/status" || fail "shuntctl status does not say why $off is off"
ok "shuntctl status shows $off off, and why"
scrape > "$TMP/m1" || fail "no scrape"
grep -Eq '^shunt_process_mode\{rank="7",mode="off"\} 1$' "$TMP/m1" ||
  fail "no shunt_process_mode sample for $off (rank 7): $(grep shunt_process_mode "$TMP/m1")"
grep -Eq '^shunt_process_mode\{mode="observe"\} 1$' "$TMP/m1" || fail "the agent's own mode is missing"
ok "metrics: $(grep 'rank="7"' "$TMP/m1" | grep shunt_process_mode)"
expect_eq "$(wc -l < "$TMP/off.err")" 1 "lines on the off process's stderr"

wait $off
expect_eq "$?" 0 "the off process's exit status"
"$B/bin/shuntctl" status > "$TMP/status2"
grep -Eq "^$off +off +.* exited " "$TMP/status2" || fail "not shown as exited: $(cat "$TMP/status2")"
ok "shown as exited after it ended"
