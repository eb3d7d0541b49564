#!/usr/bin/env bash
# A program that connects and then forks keeps working under the preload;
# the child reports only its own traffic (in NAME.PID), the parent its own.
# timeout: 60
. "$(dirname "$0")/../lib.sh"
port=$(free_port)
"$B/test/tcp_echo" "$port" 3 &
srv=$!
at_exit "kill $srv 2>/dev/null"
# Only once the server listens: a refused connect retries with a new socket,
# which would add an empty record and change the counts below.
for i in $(seq 1 100); do ss -ltn | grep -q "127.0.0.1:$port " && break; sleep 0.05; done
SHUNT_MODE=observe SHUNT_STATS_FILE="$TMP/st.json" LD_PRELOAD=$LIB "$B/test/fork_conn" "$port" || fail "fork_conn failed"
wait $srv
p=$TMP/st.json
[ -f "$p" ] || fail "no parent stats"
child=$(ls "$TMP"/st.json.* 2>/dev/null | grep -v '\.tmp\.') || fail "no child stats file NAME.PID"
expect_eq "$(jget "$p" 'd["forks"]')" 1 "forks counted in the parent"
# parent: inherited socket carried 'p' and 'r' pings (2 x 64 each way), own one 64
expect_eq "$(jget "$p" 'sorted(x["tx_bytes"] for x in d["sockets"])')" "[64, 128]" "parent tx per socket"
expect_eq "$(jget "$p" 'sorted(x["rx_bytes"] for x in d["sockets"])')" "[64, 128]" "parent rx per socket"
# child: its own socket 64 each way; the inherited one shows no traffic of the child
expect_eq "$(jget "$child" 'sorted(x["tx_bytes"] for x in d["sockets"])')" "[0, 64]" "child tx per socket"
expect_eq "$(jget "$child" 'd["forks"]')" 0 "child's own forks"
