#!/usr/bin/env bash
# The /metrics endpoint answers scrapes while 300 connections stay open
# that never finish a request (silent, or half a head sent, each renewed
# as soon as it is dropped): it serves its clients together from one poll
# loop, each with a deadline and a bounded head, and the client waiting
# longest for its head gives way when the table is full. A head over the
# bound is answered 431. (It served one client at a time, each allowed 2 s:
# 500 idle connections made a scrape wait 14 s.)
# timeout: 60
. "$(dirname "$0")/../lib.sh"
mport=$(free_port)
export SHUNT_RUN_DIR=$TMP/run SHUNT_MODE=observe SHUNT_METRICS_ADDR=127.0.0.1:$mport
mkdir -p "$SHUNT_RUN_DIR"
scrape() {  # TIMEOUT_S
  python3 -c 'import sys, urllib.request; sys.stdout.write(urllib.request.urlopen(sys.argv[1], timeout=float(sys.argv[2])).read().decode())' \
    "http://127.0.0.1:$mport/metrics" "$1"
}
LD_PRELOAD=$LIB "$B/test/hold_socket" 50000 & agent=$!
at_exit "kill $agent 2>/dev/null"
for i in $(seq 50); do scrape 2 > "$TMP/m0" 2>/dev/null && break; sleep 0.1; done
grep -q '^shunt_build_info{version="' "$TMP/m0" || fail "no /metrics on port $mport"

python3 "$ROOT/test/e2e/hold_conns.py" --kind http --port "$mport" --count 300 --seconds 45 > "$TMP/flood.json" &
flood=$!
at_exit "kill $flood 2>/dev/null"
sleep 3  # every client slot taken, the first heads' deadlines past
answered=0
for i in $(seq 1 6); do
  t0=$(date +%s%N)
  if scrape 5 > "$TMP/m$i" 2> "$TMP/e$i" && grep -q '^shunt_build_info{version="' "$TMP/m$i"; then
    answered=$((answered + 1))
    echo "scrape $i: answered after $((($(date +%s%N) - t0) / 1000000)) ms"
  else
    echo "scrape $i: $(tail -1 "$TMP/e$i")"
  fi
  sleep 0.5
done
kill -0 $flood 2>/dev/null || fail "the flood ended early: $(cat "$TMP/flood.json")"
kill -TERM $flood
wait $flood
echo "flood: $(cat "$TMP/flood.json")"
[ "$(jget "$TMP/flood.json" 'd["opened"]')" -ge 300 ] || fail "the flood opened fewer than 300 connections"
expect_eq "$answered" 6 "scrapes answered while 300 connections were held"

# A head that does not end within its bound (16 KiB) is answered 431.
python3 - "$mport" <<'PY' || fail "an endless head was not refused"
import socket, sys
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=5)
head = b"GET /metrics HTTP/1.0\r\n"
head += b"X-Filler: " + b"a" * (16384 - len(head) - 10)
assert len(head) == 16384
s.sendall(head)
got = b""
while True:
    d = s.recv(4096)
    if not d:
        break
    got += d
print(got[:60])
assert got.startswith(b"HTTP/1.0 431"), got[:60]
PY
ok "an endless head is answered 431"
scrape 5 > "$TMP/m9" || fail "no scrape after the flood"
ok "still serving"
