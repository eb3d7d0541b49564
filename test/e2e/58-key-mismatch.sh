#!/usr/bin/env bash
# A peer that holds another job key (a node whose shunt-run made a key of
# its own) is named once: three clients with a wrong key reach the agent's
# peer channel, and the agent logs one line and one key_mismatch event
# naming the peer's address, then still serves the right key.
# timeout: 60
. "$(dirname "$0")/../lib.sh"
port=$(free_port)
export SHUNT_RUN_DIR=$TMP/run SHUNT_MODE=observe SHUNT_PEER_ADDR=127.0.0.1 SHUNT_PEER_PORT=$port
mkdir -p "$SHUNT_RUN_DIR"
SHUNT_JOB_KEY=sesame SHUNT_LOG_LEVEL=info SHUNT_LOG_FILE="$TMP/agent.log" SHUNT_EVENT_LOG="$TMP/events.jsonl" \
  LD_PRELOAD=$LIB "$B/test/hold_socket" 20000 &
agent=$!
at_exit "kill $agent 2>/dev/null"
for i in $(seq 1 50); do grep -q "peer channel: listening" "$TMP/agent.log" 2>/dev/null && break; sleep 0.1; done
grep -q "peer channel: listening on 127.0.0.1:$port" "$TMP/agent.log" || fail "agent not listening: $(cat "$TMP/agent.log")"
for i in 1 2 3; do
  SHUNT_JOB_KEY=another-node "$B/bin/shunt-peer" ping 127.0.0.1 --port "$port" --timeout 2000 2>/dev/null &&
    fail "a client with another key got an answer"
done
SHUNT_JOB_KEY=sesame "$B/bin/shunt-peer" ping 127.0.0.1 --port "$port" >/dev/null || fail "the right key is no longer served"
for i in $(seq 1 30); do grep -q '"key_mismatch"' "$TMP/events.jsonl" 2>/dev/null && break; sleep 0.1; done
n=$(grep -c "does not hold this job's key" "$TMP/agent.log")
[ "$n" = 1 ] || { cat "$TMP/agent.log"; fail "$n lines name the key mismatch, want 1"; }
grep "does not hold this job's key" "$TMP/agent.log" | grep -q "peer channel: 127.0.0.1 .*SHUNT_JOB_KEY_FILE" ||
  fail "the line does not name the peer and what to set"
ok "$(grep "does not hold this job's key" "$TMP/agent.log")"
expect_eq "$(grep -c '"event":"key_mismatch"' "$TMP/events.jsonl")" 1 "key_mismatch events"
grep '"event":"key_mismatch"' "$TMP/events.jsonl" | grep -q '"peer":"127.0.0.1"' || fail "the event does not name the peer"
