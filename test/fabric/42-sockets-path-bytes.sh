#!/usr/bin/env bash
# After rail 0 of a two-rail MPTCP connection goes down, the bytes that
# move on over rail 1 are credited to rail 1's path, in `shuntctl paths`
# and in shunt_path_tx_bytes_total, and shunt_socket_subflows counts the
# connection's subflows. (The socket's own addresses stay rail 0's: its
# first subflow's.)
# timeout: 90
. "$(dirname "$0")/../lib.sh"
. "$(dirname "$0")/sockets-lib.bash"
sock_need
[ -f "$LIB" ] || fail "no $LIB"
sock_fabric_up "pb$$"
ip -n "$(sock_ns h1)" link set lo up  # the metrics endpoint on loopback
port=$(free_port) mport=$(free_port)
# A sink on h2 and a sender on h1 at ~4 MB/s for 16 s, both under shunt.
ip netns exec "$(sock_ns h2)" env $(sock_env 2) /usr/bin/python3 -c '
import socket, sys
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("10.0.2.2", int(sys.argv[1]))); s.listen(1); c, _ = s.accept()
while c.recv(1 << 16): pass' "$port" > "$TMP/sink.log" 2>&1 &
sink=$!
ip netns exec "$(sock_ns h1)" env $(sock_env 1) SHUNT_METRICS_ADDR=127.0.0.1:$mport SHUNT_REPORT_INTERVAL_MS=200 \
  /usr/bin/python3 -c '
import socket, sys, time
for i in range(50):
    try:
        s = socket.create_connection(("10.0.2.2", int(sys.argv[1]))); break
    except OSError: time.sleep(0.1)
end = time.time() + 16; b = b"x" * 40000
while time.time() < end:
    s.sendall(b); time.sleep(0.01)' "$port" > "$TMP/send.log" 2>&1 &
send=$!
at_exit "kill $sink $send 2>/dev/null"
ctl() { SHUNT_RUN_DIR=$TMP/run-h1 "$B/bin/shuntctl" "$@"; }
rails() {  # "rail0_tx rail1_tx" from shuntctl paths --json
  ctl paths --json --interval 100 > "$TMP/paths.json" 2>/dev/null || { echo "0 0"; return; }
  jget "$TMP/paths.json" '" ".join(str(sum(p["tx_bytes"] for p in d["paths"] if p["rail"] == r)) for r in (0, 1))'
}
scrape() {
  ip netns exec "$(sock_ns h1)" python3 -c 'import sys, urllib.request; sys.stdout.write(urllib.request.urlopen(sys.argv[1], timeout=5).read().decode())' \
    "http://127.0.0.1:$mport/metrics"
}
# Both subflows up and carrying (the second joins once the agents announce rail 1).
for i in $(seq 60); do
  scrape > "$TMP/m0" 2>"$TMP/scrape.err" && grep -Eq '^shunt_socket_subflows(\{.*\})? [2-9]' "$TMP/m0" && break
  sleep 0.25
done
grep -E '^shunt_socket_subflows' "$TMP/m0"
grep -Eq '^shunt_socket_subflows(\{.*\})? [2-9]' "$TMP/m0" ||
  fail "no MPTCP subflows counted: $(grep "^shunt_socket_subflows" "$TMP/m0"; tail -n 1 "$TMP/scrape.err")"
ok "shunt_socket_subflows counts the connection's subflows"
# From 2 s after rail 0 went down (the connection has moved) to 6 s after.
fault_down_forever
sleep 2
read -r a0 a1 <<< "$(rails)"
sleep 4
read -r b0 b1 <<< "$(rails)"
scrape > "$TMP/m1" || fail "no scrape after the fault"
kill -0 $send 2>/dev/null || fail "the sender ended (rail 0 down): $(tail -n 3 "$TMP/send.log")"
echo "path tx bytes 2 s after the fault: rail 0 $a0, rail 1 $a1; 6 s after: rail 0 $b0, rail 1 $b1"
[ $((b1 - a1)) -gt 2000000 ] || fail "rail 1 credited $((b1 - a1)) bytes from 2 to 6 s after rail 0 went down"
[ $((4 * (b0 - a0))) -lt $((b1 - a1)) ] || fail "the dead rail 0 credited $((b0 - a0)) bytes, the live rail 1 $((b1 - a1))"
ok "shuntctl paths: the bytes after the fault are rail 1's"
m1=$(grep -E '^shunt_path_tx_bytes_total\{peer="h2",rail="1",' "$TMP/m1" | awk '{print $2}')
[ "${m1:-0}" -ge "$b1" ] || fail "shunt_path_tx_bytes_total for rail 1: '${m1:-}', shuntctl said $b1"
ok "shunt_path_tx_bytes_total{rail=\"1\"} = $m1"
