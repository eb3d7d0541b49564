#!/usr/bin/env bash
# The peer channel serves a peer that holds the job key while others hold
# hundreds of connections that never authenticate (silent, or half a frame
# sent, each renewed as soon as it is dropped): those still to authenticate
# have a bound and a deadline of their own, a new one pushes out the oldest
# of the address holding the most, and every ping of the real peer is
# answered. (One bound for both, and 5 s to authenticate, made 64 such
# connections refuse every peer.)
# timeout: 60
. "$(dirname "$0")/../lib.sh"
port=$(free_port)
export SHUNT_RUN_DIR=$TMP/run SHUNT_MODE=observe SHUNT_PEER_ADDR=127.0.0.1 SHUNT_PEER_PORT=$port
mkdir -p "$SHUNT_RUN_DIR"
SHUNT_JOB_KEY=sesame SHUNT_LOG_LEVEL=info SHUNT_LOG_FILE="$TMP/agent.log" LD_PRELOAD=$LIB "$B/test/hold_socket" 50000 &
agent=$!
at_exit "kill $agent 2>/dev/null"
for i in $(seq 1 50); do grep -q "peer channel: listening" "$TMP/agent.log" 2>/dev/null && break; sleep 0.1; done
grep -q "peer channel: listening on 127.0.0.1:$port" "$TMP/agent.log" || fail "agent not listening: $(cat "$TMP/agent.log")"
SHUNT_JOB_KEY=sesame "$B/bin/shunt-peer" ping 127.0.0.1 --port "$port" >/dev/null || fail "no answer before the flood"

# 300 connections from four other loopback addresses, for 14 s.
python3 "$ROOT/test/e2e/hold_conns.py" --kind peer --port "$port" --count 300 --seconds 45 \
  --from 127.0.0.2,127.0.0.3,127.0.0.4,127.0.0.5 > "$TMP/flood.json" &
flood=$!
at_exit "kill $flood 2>/dev/null"
sleep 3  # every slot taken, and the first deadlines past
answered=0
for i in $(seq 1 8); do
  if SHUNT_JOB_KEY=sesame timeout 10 "$B/bin/shunt-peer" ping 127.0.0.1 --port "$port" --timeout 3000 \
      > "$TMP/ping$i" 2>&1; then
    answered=$((answered + 1))
  else
    echo "ping $i: $(cat "$TMP/ping$i")"
  fi
  sleep 0.5
done
kill -0 $flood 2>/dev/null || fail "the flood ended early: $(cat "$TMP/flood.json")"
kill -TERM $flood
wait $flood
echo "flood: $(cat "$TMP/flood.json")"
opened=$(jget "$TMP/flood.json" 'd["opened"]')
[ "$opened" -ge 300 ] || fail "the flood opened only $opened connections"
expect_eq "$answered" 8 "pings answered during the flood"
python3 - "$SHUNT_RUN_DIR/agent.sock" <<'PY' > "$TMP/ctr.json" || fail "no counters"
import json, socket, sys
s = socket.socket(socket.AF_UNIX); s.connect(sys.argv[1]); s.sendall(b'{"cmd":"peer-channel"}\n')
print(s.makefile().readline())
PY
echo "listener: $(cat "$TMP/ctr.json")"
expect_eq "$(jget "$TMP/ctr.json" 'd["authenticated"]')" 9 "authenticated sessions (the 8 and the first)"
SHUNT_JOB_KEY=sesame "$B/bin/shunt-peer" ping 127.0.0.1 --port "$port" >/dev/null || fail "no answer after the flood"
ok "still serving after the flood"
