#!/usr/bin/env bash
# The host agent's control socket under careless and hostile clients of its
# own user: malformed reports are answered with errors and kill nothing;
# while 300 connections stay idle or half-sent (reopened as the agent drops
# them), `status` is answered at once and the other process's reports get
# through; lines past the bound are cut off and the partial lines of many
# clients do not pile up in the agent's memory.
# timeout: 60
. "$(dirname "$0")/../lib.sh"
export SHUNT_RUN_DIR=$TMP/run SHUNT_MODE=observe SHUNT_REPORT_INTERVAL_MS=200
LD_PRELOAD=$LIB "$B/test/hold_socket" 50000 2>"$TMP/a.log" & a=$!
sleep 0.5
LD_PRELOAD=$LIB "$B/test/hold_socket" 50000 2>"$TMP/b.log" & b=$!
at_exit "kill $a $b 2>/dev/null"
sock=$SHUNT_RUN_DIR/agent.sock
for _ in $(seq 1 50); do [ -S "$sock" ] && break; sleep 0.1; done
[ -S "$sock" ] || fail "no agent socket at $sock: $(cat "$TMP/a.log")"
alive() { kill -0 $a 2>/dev/null && kill -0 $b 2>/dev/null || fail "a process died $1: $(cat "$TMP/a.log" "$TMP/b.log")"; }

# Malformed reports (each of which once aborted the agent's process, at
# once or at the next status): an error each, and status still answers.
python3 - "$sock" <<'PY' || fail "malformed reports"
import json, socket, sys
lines = [
    {"cmd": "report", "pid": 1, "snapshot": 5},
    {"cmd": "report", "pid": 1, "snapshot": {}, "seq": "x"},
    {"cmd": "report", "pid": 1, "snapshot": {}, "final": "yes"},
    {"cmd": "report", "pid": 1, "snapshot": {"sockets": [{"peer": 5}]}},
    {"cmd": "report", "pid": 1, "snapshot": {"verbs": 5}},
]
s = socket.socket(socket.AF_UNIX); s.settimeout(5); s.connect(sys.argv[1]); f = s.makefile("rwb")
for req in lines:
    f.write(json.dumps(req).encode() + b"\n"); f.flush()
    ans = json.loads(f.readline())
    print("answered:", ans)
    assert "error" in ans, (req, ans)
f.write(b'{"cmd":"report","pid":1,"snapshot":{"x":' + b"[" * 100000 + b"]" * 100000 + b"}}\n"); f.flush()
assert "error" in json.loads(f.readline())
f.write(b'{"cmd":"status"}\n'); f.flush()
st = json.loads(f.readline())
assert "members" in st, st
assert 1 not in [m["pid"] for m in st["members"]], st
PY
sleep 0.5
alive "after the malformed reports"
ok "malformed reports refused, both processes alive"

# 300 clients of this user that never finish a line (half idle, half
# half-sent), reopened as the agent drops them, for 6 s.
python3 - "$sock" 6 > "$TMP/attack.log" 2>&1 <<'PY' & attacker=$!
import select, socket, sys, time
path, secs = sys.argv[1], float(sys.argv[2])
def conn(i):
    s = socket.socket(socket.AF_UNIX); s.setblocking(False)
    try:
        s.connect(path)
        if i % 2: s.send(b'{"cmd":"sta')
    except OSError:
        pass
    return s
socks = [conn(i) for i in range(300)]
print("open", len(socks), flush=True)
reopened, end = 0, time.time() + secs
while time.time() < end:
    r, _, _ = select.select(socks, [], [], 0.1)
    for s in r:
        i = socks.index(s)
        try: data = s.recv(100)
        except OSError: data = b""
        if not data:
            s.close(); socks[i] = conn(i); reopened += 1
print("reopened", reopened, flush=True)
PY
at_exit "kill $attacker 2>/dev/null"
for _ in $(seq 1 50); do grep -q open "$TMP/attack.log" && break; sleep 0.1; done
sleep 0.3
for i in 1 2 3 4 5; do
  t0=$(date +%s%N)
  timeout 5 "$B/bin/shuntctl" status --json > "$TMP/st$i" 2>"$TMP/st$i.err" || fail "status refused during the attack ($i): $(cat "$TMP/st$i.err")"
  ok "status answered during the attack in $(( ($(date +%s%N) - t0) / 1000000 )) ms"
  sleep 0.8
done
age=$(jget "$TMP/st5" "[m['report_age_ms'] for m in d['members'] if m['pid'] == $b][0]")
[ "$age" -lt 1500 ] || fail "process $b's report is $age ms old: its reports were refused during the attack"
ok "process $b's reports got through (the last $age ms old)"
wait $attacker
cat "$TMP/attack.log"
grep -q "reopened [1-9]" "$TMP/attack.log" || fail "idle clients were never dropped"
alive "after the attack"

# A line past the bound is cut off; 40 clients with a large partial line
# each do not add 40 of them to the agent's memory.
rss() { awk '/VmRSS/ { print $2 }' /proc/$a/status; }
r0=$(rss)
python3 - "$sock" <<'PY' || fail "long lines"
import socket, sys
chunk = b"x" * (1 << 20)
cut = 0
socks = []
for i in range(40):
    s = socket.socket(socket.AF_UNIX); s.settimeout(3); s.connect(sys.argv[1])
    try:
        for _ in range(8): s.sendall(chunk)   # 8 MiB, no newline
    except OSError:
        cut += 1
    socks.append(s)
print("cut off:", cut, "of 40")
assert cut == 40, cut
PY
r1=$(rss)
ok "agent's resident memory $r0 kB -> $r1 kB"
[ $((r1 - r0)) -lt 102400 ] || fail "40 partial lines added $(( (r1 - r0) / 1024 )) MiB to the agent"
alive "after the long lines"
"$B/bin/shuntctl" status >/dev/null || fail "no status at the end"
ok "the agent serves on"
