#!/usr/bin/env bash
# A member killed without a last report (SIGKILL, as the OOM killer does)
# is counted as exited, shown "gone", within a few report intervals; it
# showed as running for as long as the agent lived. A member that exits
# normally is "exited", not gone, and a live one stays running.
# timeout: 60
. "$(dirname "$0")/../lib.sh"
export SHUNT_RUN_DIR=$TMP/run SHUNT_MODE=observe SHUNT_REPORT_INTERVAL_MS=200
mkdir -p "$SHUNT_RUN_DIR"
ctl() { "$B/bin/shuntctl" "$@"; }
LD_PRELOAD=$LIB "$B/test/hold_socket" 60000 & a=$!
at_exit "kill $a 2>/dev/null"
for _ in $(seq 50); do
  [ "$(ctl status --json 2>/dev/null | python3 -c 'import json, sys; print(json.load(sys.stdin)["agent_pid"])' 2>/dev/null)" = "$a" ] && break
  sleep 0.1
done
LD_PRELOAD=$LIB "$B/test/hold_socket" 60000 & k=$!
LD_PRELOAD=$LIB "$B/test/hold_socket" 60000 & l=$!
at_exit "kill $a $k $l 2>/dev/null"
state() {  # PID: running, exited or gone, from status --json
  ctl status --json | python3 -c 'import json, sys
m = [m for m in json.load(sys.stdin)["members"] if m["pid"] == int(sys.argv[1])]
print("none" if not m else "running" if not m[0]["exited"] else "gone" if m[0]["lost"] else "exited")' "$1"
}
for _ in $(seq 50); do [ "$(state $k)" = running ] && [ "$(state $l)" = running ] && break; sleep 0.2; done
expect_eq "$(state $k)" running "the member to be killed, before"
LD_PRELOAD=$LIB "$B/test/hold_socket" 200 || fail "a short member exited $?"
kill -9 $k; wait $k 2>/dev/null
t0=$SECONDS
while [ $((SECONDS - t0)) -lt 10 ]; do [ "$(state $k)" = gone ] && break; sleep 0.1; done
expect_eq "$(state $k)" gone "the killed member"
echo "killed member counted gone after $((SECONDS - t0)) s or less"
ctl status | grep -q "^$k .* gone " || fail "plain status does not say gone for $k"
expect_eq "$(ctl status --json | python3 -c 'import json, sys
print(sum(1 for m in json.load(sys.stdin)["members"] if m["exited"] and not m["lost"]))')" 1 "members that exited with a last report"
expect_eq "$(state $l)" running "the live member"
expect_eq "$(state $a)" running "the agent"
ok "a killed member is gone, the others keep their states"
