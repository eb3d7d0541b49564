#!/usr/bin/env bash
# The first shunt process on a host becomes its agent and the others report
# to it; when the agent dies another process takes over within a second or
# two; bad requests, and any request from another user, are refused
# without harm.
# timeout: 60
. "$(dirname "$0")/../lib.sh"
export SHUNT_RUN_DIR=$TMP/run SHUNT_MODE=observe SHUNT_REPORT_INTERVAL_MS=200
mkdir -p "$SHUNT_RUN_DIR"
ctl() { "$B/bin/shuntctl" "$@"; }
LD_PRELOAD=$LIB "$B/test/hold_socket" 40000 & a=$!
sleep 0.5
LD_PRELOAD=$LIB "$B/test/hold_socket" 40000 & b=$!
at_exit "kill $a $b 2>/dev/null"
sleep 1
ctl status --json > "$TMP/s1" || fail "no agent answers"
expect_eq "$(jget "$TMP/s1" 'd["agent_pid"]')" "$a" "first process is the agent"
expect_eq "$(jget "$TMP/s1" 'sorted(m["pid"] for m in d["members"])')" "$(python3 -c "print(sorted([$a, $b]))")" "members"
ctl status | grep -q "^$b " || fail "plain status lacks member $b"

# Malformed and unknown requests get an error; the agent keeps serving.
python3 - "$SHUNT_RUN_DIR/agent.sock" <<'PY' || fail "bad requests not answered with errors"
import json, socket, sys
for line in [b"{not json\n", b'{"cmd": 5}\n', b'{"cmd": "nope"}\n', b'{"cmd":"report"}\n']:
    s = socket.socket(socket.AF_UNIX); s.connect(sys.argv[1]); s.sendall(line)
    ans = json.loads(s.makefile().readline()); s.close()
    assert "error" in ans, (line, ans)
    print("refused:", ans["error"])
PY
# Another user cannot send a report, nor read: the socket is the agent's
# user's alone (0600), and opened to all, the agent refuses that uid.
expect_eq "$(stat -c %a "$SHUNT_RUN_DIR/agent.sock")" 600 "the control socket's mode"
if command -v setpriv >/dev/null; then
  chmod 0755 "$TMP" "$SHUNT_RUN_DIR"
  report_as_nobody() {
    setpriv --reuid=65534 --regid=65534 --clear-groups /usr/bin/python3 -c '
import json, socket, sys
s = socket.socket(socket.AF_UNIX)
try: s.connect(sys.argv[1])
except PermissionError: print("cannot connect"); sys.exit(0)
try: s.sendall(json.dumps({"cmd": "report", "pid": 1, "snapshot": {}}).encode() + b"\n")
except OSError: pass  # refused before it was sent: the answer is there to read
ans = json.loads(s.makefile().readline()); print(ans); sys.exit(0 if list(ans) == ["error"] else 1)' "$SHUNT_RUN_DIR/agent.sock"
  }
  report_as_nobody || fail "another user could connect"
  chmod 0666 "$SHUNT_RUN_DIR/agent.sock"
  report_as_nobody || fail "another user's connection was served"
  chmod 0600 "$SHUNT_RUN_DIR/agent.sock"
  ok "another user's report refused"
fi
ctl status --json > "$TMP/s1b"
expect_eq "$(jget "$TMP/s1b" 'd["agent_pid"]')" "$a" "agent unharmed"

# Between reports (every 200 ms here) and requests the agent's thread
# sleeps: a few dozen wakeups a second at most, for agent and member alike.
# (It once woke every millisecond, a fifth of a one-CPU guest's time.)
switches() {  # PID: context switches of its thread named shunt-agent
  local t
  for t in /proc/$1/task/*; do
    [ "$(cat "$t/comm")" = shunt-agent ] && awk '/ctxt_switches/ { n += $2 } END { print n }' "$t/status" && return
  done
  echo "no shunt-agent thread in $1" >&2; echo 0
}
for p in $a $b; do
  n0=$(switches $p); sleep 1; n1=$(switches $p)
  [ "$n0" -gt 0 ] && [ $((n1 - n0)) -lt 60 ] || fail "process $p's agent thread woke $((n1 - n0)) times in a second"
  ok "process $p's agent thread woke $((n1 - n0)) times in a second"
done

# The agent's own process is snapshotted when something reads the members,
# not at every report (a snapshot walks every QP and bundle: on one-CPU
# guests one a second cost a job a tenth of its CPU); what is read is the
# whole snapshot, and fresh.
ctl status --json > "$TMP/own1"
sleep 1.5
ctl status --json > "$TMP/own2"
n1=$(jget "$TMP/own1" 'd["own_snapshots"]') n2=$(jget "$TMP/own2" 'd["own_snapshots"]')
[ $((n2 - n1)) -le 1 ] || fail "the agent built $((n2 - n1)) snapshots of itself in 1.5 s with one read"
ok "one snapshot of the agent's own process per read ($n1, then $n2)"
python3 - "$SHUNT_RUN_DIR/agent.sock" "$a" <<'PY' || fail "the agent's own entry is not a whole, fresh snapshot"
import json, socket, sys
s = socket.socket(socket.AF_UNIX); s.connect(sys.argv[1]); s.sendall(b'{"cmd":"members"}\n')
own = json.loads(s.makefile().readline())["members"][sys.argv[2]]
assert "qps" in own["verbs"] and "calls" in own["verbs"], own.keys()
PY
m=$(jget "$TMP/own2" '[x["report_age_ms"] for x in d["members"] if x["pid"] == '"$a"'][0]')
[ "$m" -lt 1000 ] || fail "the agent's own entry was $m ms old when read"

# The agent dies (no chance to clean up); the kernel releases its lock.
kill -KILL $a
wait $a 2>/dev/null
t0=$(date +%s%N)
for i in $(seq 1 40); do
  ctl status --json > "$TMP/s2" 2>/dev/null && [ "$(jget "$TMP/s2" 'd["agent_pid"]')" = "$b" ] && break
  sleep 0.1
done
took=$(( ($(date +%s%N) - t0) / 1000000 ))
expect_eq "$(jget "$TMP/s2" 'd["agent_pid"]')" "$b" "the other process took over"
ok "takeover after ${took} ms"
[ "$took" -lt 3000 ] || fail "takeover took ${took} ms"
