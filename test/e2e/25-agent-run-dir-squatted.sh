#!/usr/bin/env bash
# Another user made the run directory first (/tmp/shunt-UID, 0777, a lock
# held and a socket listening in it): the job's process refuses it with a
# line that names it and why, becomes the agent in its private runtime
# directory ($XDG_RUNTIME_DIR/shunt), where shuntctl finds it, and nothing
# of it reaches the squatter. Without a runtime directory it runs on
# without an agent. Its own socket lets no other user in.
# timeout: 60
. "$(dirname "$0")/../lib.sh"
[ "$(id -u)" = 0 ] || skip "needs root (to act as two other users)"
command -v setpriv >/dev/null || skip "no setpriv"
as() { local u=$1; shift; setpriv --reuid="$u" --regid="$u" --clear-groups "$@"; }
chmod 711 "$TMP"
# The job's user: a uid of its own, so that /tmp/shunt-UID is this test's.
for _ in $(seq 1 20); do
  V=$((61000 + RANDOM % 4000))
  [ ! -e /tmp/shunt-$V ] && break
done
[ ! -e /tmp/shunt-$V ] || skip "no free uid for /tmp/shunt-UID"
as $V test -x "$B/test/hold_socket" && as $V test -r "$LIB" || skip "the build is out of another user's reach"
SQ=/tmp/shunt-$V
at_exit "rm -rf $SQ"

# The squatter (nobody): the directory, the lock held, a listener that
# writes down what it is sent.
mkdir -m 0777 "$SQ" && chown 65534:65534 "$SQ" && chmod 0777 "$SQ"
mkdir "$TMP/sq" && chown 65534:65534 "$TMP/sq"
as 65534 /usr/bin/python3 - "$SQ" "$TMP/sq/log" <<'PY' & squatter=$!
import fcntl, os, socket, sys, time
d, log = sys.argv[1:]
lock = os.open(d + "/agent.lock", os.O_RDWR | os.O_CREAT, 0o666); os.fchmod(lock, 0o666)
fcntl.flock(lock, fcntl.LOCK_EX)
s = socket.socket(socket.AF_UNIX); s.bind(d + "/agent.sock"); os.chmod(d + "/agent.sock", 0o777); s.listen(16)
s.settimeout(0.2)
end = time.time() + 40
with open(log, "w") as out:
    print("squatting", flush=True, file=out)
    while time.time() < end:
        try: c, _ = s.accept()
        except socket.timeout: continue
        c.settimeout(1)
        try: data = c.recv(200)
        except OSError: data = b""
        print("got:", data[:120], flush=True, file=out)
        c.close()
PY
at_exit "kill $squatter 2>/dev/null"
for _ in $(seq 1 50); do grep -q squatting "$TMP/sq/log" 2>/dev/null && break; sleep 0.1; done
[ -S "$SQ/agent.sock" ] || fail "the squatter did not start"

XDG=$TMP/xdg-$V
mkdir -m 0700 "$XDG" && chown $V:$V "$XDG"
victim() {  # XDG_RUNTIME_DIR (or empty) MS -> becomes the job's process, its stderr in $TMP/v.log
  exec setpriv --reuid=$V --regid=$V --clear-groups env -u SHUNT_RUN_DIR ${1:+XDG_RUNTIME_DIR=$1} \
    SHUNT_MODE=observe SHUNT_REPORT_INTERVAL_MS=200 LD_PRELOAD="$LIB" "$B/test/hold_socket" "$2" 2>"$TMP/v.log"
}
victim "$XDG" 4000 & v=$!
at_exit "kill $v 2>/dev/null"
st=""
for _ in $(seq 1 30); do
  sleep 0.2
  st=$(as $V env XDG_RUNTIME_DIR="$XDG" "$B/bin/shuntctl" status --json 2>"$TMP/ctl.err") && break
done
[ -n "$st" ] || fail "shuntctl finds no agent of the job's user: $(cat "$TMP/ctl.err"); the process said: $(cat "$TMP/v.log")"
echo "$st" > "$TMP/st.json"
expect_eq "$(jget "$TMP/st.json" 'd["agent_pid"]')" "$v" "the job's process is its agent"
expect_eq "$(jget "$TMP/st.json" 'd["run_dir"]')" "$XDG/shunt" "run directory"
expect_eq "$(stat -c '%a %u' "$XDG/shunt")" "700 $V" "the private directory's mode and owner"
expect_eq "$(stat -c '%a' "$XDG/shunt/agent.sock")" "600" "the socket's mode"
grep -q "run directory $SQ refused: owned by uid 65534, not $V" "$TMP/v.log" \
  || fail "no line names the refused directory: $(cat "$TMP/v.log")"
ok "refused with: $(grep -o "run directory $SQ refused.*" "$TMP/v.log" | head -1)"

# Another user (nobody) cannot reach the job's agent: the directory and
# the socket are the job's user's; opened to all, the agent checks the
# client's uid.
as 65534 /usr/bin/python3 - "$XDG/shunt/agent.sock" <<'PY' || fail "another user could connect"
import socket, sys
s = socket.socket(socket.AF_UNIX)
try: s.connect(sys.argv[1])
except PermissionError as e: print("refused:", e); sys.exit(0)
sys.exit(1)
PY
chmod 0711 "$XDG" "$XDG/shunt"; chmod 0666 "$XDG/shunt/agent.sock"
as 65534 /usr/bin/python3 - "$XDG/shunt/agent.sock" <<'PY' || fail "another user was served"
import json, socket, sys
s = socket.socket(socket.AF_UNIX); s.settimeout(3); s.connect(sys.argv[1])
try: s.sendall(b'{"cmd":"status"}\n')
except OSError: pass  # refused before it was sent: the answer is there to read
ans = json.loads(s.makefile().readline())
print("answered:", ans)
sys.exit(0 if list(ans) == ["error"] else 1)
PY
ok "another user's connection refused by its uid"
wait $v || fail "the job's process failed"

# No runtime directory: no agent, one line that says so, the process runs
# and exits as it would.
(victim "" 1000) || fail "the process failed without a run directory: $(cat "$TMP/v.log")"
grep -q "run directory $SQ refused.*no host agent" "$TMP/v.log" || fail "no line says there is no agent: $(cat "$TMP/v.log")"
ok "without a runtime directory: $(grep -o "XDG_RUNTIME_DIR.*" "$TMP/v.log" | head -1)"
grep -q "got:" "$TMP/sq/log" && fail "the squatter was sent: $(grep got: "$TMP/sq/log")"
ok "nothing reached the squatter"
