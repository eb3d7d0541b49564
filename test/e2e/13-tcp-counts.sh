#!/usr/bin/env bash
# Observe mode counts exactly the bytes a TCP client/server pair exchanged
# over loopback, through send/write/writev/sendmsg and
# recv/read/readv/recvmsg, on both ends.
# timeout: 60
. "$(dirname "$0")/../lib.sh"
port=$(free_port)
export SHUNT_MODE=observe
SHUNT_STATS_FILE="$TMP/server.json" LD_PRELOAD=$LIB "$B/test/tcp_pair" server "$port" &
srv=$!
at_exit "kill $srv 2>/dev/null"
# The client must find the server listening at once: a refused connect makes
# it retry with a new socket, which would be a second (empty) record.
for i in $(seq 1 100); do ss -ltn | grep -q "127.0.0.1:$port " && break; sleep 0.05; done
SHUNT_STATS_FILE="$TMP/client.json" LD_PRELOAD=$LIB "$B/test/tcp_pair" client "$port" || fail "client failed"
wait $srv || fail "server failed"
c=$TMP/client.json s=$TMP/server.json
expect_eq "$(jget "$c" 'len(d["sockets"])')" 1 "client sockets"
expect_eq "$(jget "$c" 'd["sockets"][0]["role"]')" client "client role"
expect_eq "$(jget "$c" 'd["sockets"][0]["tx_bytes"]')" 12000 "client tx bytes"
expect_eq "$(jget "$c" 'd["sockets"][0]["rx_bytes"]')" 12000 "client rx bytes"
expect_eq "$(jget "$c" 'd["sockets"][0]["peer"]')" "127.0.0.1:$port" "client peer"
expect_eq "$(jget "$s" '[x["role"] for x in d["sockets"]]')" "['listener', 'accepted']" "server roles"
expect_eq "$(jget "$s" 'd["sockets"][1]["tx_bytes"]')" 12000 "server tx bytes"
expect_eq "$(jget "$s" 'd["sockets"][1]["rx_bytes"]')" 12000 "server rx bytes"
expect_eq "$(jget "$s" 'd["sockets"][0]["accepts"]')" 1 "accepts on the listener"
expect_eq "$(jget "$s" 'd["sockets"][1]["local"]')" "127.0.0.1:$port" "accepted local address"
expect_eq "$(jget "$s" 'd["sockets"][1]["open"]')" False "closed socket recorded as closed"

# Fortified callers (_FORTIFY_SOURCE=2) reach __recv_chk, __recvfrom_chk and
# __read_chk; those are counted the same.
fort=$B/test/tcp_pair_fortified
for f in __recv_chk __recvfrom_chk __read_chk; do
  nm -D "$fort" | grep -q " U $f@" || fail "$fort does not call $f"
done
port=$(free_port)
"$B/test/tcp_echo" "$port" 1 & echo_pid=$!
at_exit "kill $echo_pid 2>/dev/null"
SHUNT_STATS_FILE="$TMP/fort.json" LD_PRELOAD=$LIB "$fort" "$port" || fail "fortified client failed"
wait $echo_pid
expect_eq "$(jget "$TMP/fort.json" 'd["sockets"][0]["tx_bytes"]')" 3000 "fortified client tx bytes"
expect_eq "$(jget "$TMP/fort.json" 'd["sockets"][0]["rx_bytes"]')" 3000 "fortified client rx bytes"
