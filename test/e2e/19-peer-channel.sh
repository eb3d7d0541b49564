#!/usr/bin/env bash
# The agent's peer channel answers only a client that proves it holds the
# job key; a wrong key, junk, an oversized frame and a silent client are
# each dropped with one log line, and the agent goes on serving.
# timeout: 60
. "$(dirname "$0")/../lib.sh"
port=$(free_port)
export SHUNT_RUN_DIR=$TMP/run SHUNT_MODE=observe SHUNT_PEER_ADDR=127.0.0.1 SHUNT_PEER_PORT=$port
mkdir -p "$SHUNT_RUN_DIR"
SHUNT_JOB_KEY=sesame SHUNT_LOG_LEVEL=info SHUNT_LOG_FILE="$TMP/agent.log" LD_PRELOAD=$LIB "$B/test/hold_socket" 20000 &
agent=$!
at_exit "kill $agent 2>/dev/null"
for i in $(seq 1 50); do grep -q "peer channel: listening" "$TMP/agent.log" 2>/dev/null && break; sleep 0.1; done
grep -q "peer channel: listening on 127.0.0.1:$port" "$TMP/agent.log" || fail "agent not listening: $(cat "$TMP/agent.log")"

ans=$(SHUNT_JOB_KEY=sesame "$B/bin/shunt-peer" ping 127.0.0.1 --port "$port" --json) || fail "ping with the right key failed"
echo "$ans" > "$TMP/pong.json"
expect_eq "$(jget "$TMP/pong.json" 'd["agent_pid"]')" "$agent" "the agent answered"

SHUNT_JOB_KEY=wrong "$B/bin/shunt-peer" ping 127.0.0.1 --port "$port" --timeout 2000 2> "$TMP/wrong.err" \
  && fail "a client with the wrong key got an answer"
ok "wrong key refused: $(cat "$TMP/wrong.err")"
"$B/bin/shunt-peer" ping 127.0.0.1 --port "$port" 2>/dev/null && fail "no key must not work"

python3 - "$port" <<'PY' || fail "junk was not dropped"
import socket, struct, sys, time
port = int(sys.argv[1])
def conn():
    s = socket.create_connection(("127.0.0.1", port), timeout=3)
    s.recv(4096)  # the hello
    return s
for junk in [b"GET /metrics HTTP/1.0\r\n\r\n",
             b"SHNT" + bytes([1, 4, 0, 0]) + struct.pack("<I", 1 << 30) + bytes(8),  # oversized
             b"SHNT" + bytes([7]) + bytes(40)]:                                      # bad version
    s = conn(); s.sendall(junk)
    assert s.recv(4096) == b"", "the agent kept a connection that sent junk"
    s.close()
PY
ok "junk dropped"

ans=$(SHUNT_JOB_KEY=sesame "$B/bin/shunt-peer" ping 127.0.0.1 --port "$port") || fail "agent stopped answering after junk"
ok "still serving: $ans"
drops=$(grep -c "peer channel: .* dropped:" "$TMP/agent.log")
expect_eq "$drops" 4 "one log line per dropped connection (wrong key + 3 junk)"
python3 - "$SHUNT_RUN_DIR/agent.sock" <<'PY' > "$TMP/ctr.json" || fail "no counters"
import json, socket, sys
s = socket.socket(socket.AF_UNIX); s.connect(sys.argv[1]); s.sendall(b'{"cmd":"peer-channel"}\n')
print(s.makefile().readline())
PY
expect_eq "$(jget "$TMP/ctr.json" 'd["authenticated"]')" 2 "authenticated sessions"
expect_eq "$(jget "$TMP/ctr.json" 'd["requests"]')" 2 "requests answered"
