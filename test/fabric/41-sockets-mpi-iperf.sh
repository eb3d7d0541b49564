#!/usr/bin/env bash
# Open MPI over TCP (btl tcp,self, an all-to-all that checks every element)
# and iperf3 --bidir run unchanged under libshunt across two namespace hosts;
# their TCP sockets are opened as MPTCP and iperf3's connection carries
# traffic on both rails.
# timeout: 120
. "$(dirname "$0")/../lib.sh"
. "$(dirname "$0")/sockets-lib.bash"
sock_need mpicc mpirun iperf3
[ -f "$LIB" ] || fail "no $LIB"
sock_fabric_up "sm$$"

# --- Open MPI: mpirun in h1 starts one rank on each host through ip netns.
mpicc -O2 -o "$TMP/a2a" "$(dirname "$0")/sockets_a2a.c" || fail "mpicc"
cat > "$TMP/agent.sh" <<AGENT
#!/bin/sh
h=\$1; shift
exec ip netns exec sf-$SF-\$h sh -c "\$*"
AGENT
chmod +x "$TMP/agent.sh"
# routed direct and no shared-memory topology (rtc_hwloc_vmhole none): with
# the defaults, Open MPI 4.1's daemons fail to start about one run in ten
# here, without shunt as with it (a route to the daemon "not known", or
# orted crashing in hwloc_shmem_topology_write at an address next to the
# stack).
mpi() {
  ip netns exec "$(sock_ns h1)" env "$@" mpirun --allow-run-as-root -np 2 -H h1,h2 \
    --mca plm_rsh_agent "$TMP/agent.sh" --mca btl tcp,self --mca btl_tcp_if_include r0,r1 \
    --mca oob_tcp_if_include r0 --mca routed direct --mca rtc_hwloc_vmhole none -x LD_PRELOAD -x SHUNT_RUN_DIR -x SHUNT_STATS_FILE "$TMP/a2a" 40
}
mpi LD_PRELOAD= SHUNT_RUN_DIR= SHUNT_STATS_FILE= > "$TMP/mpi-plain.txt" 2>&1 || fail "MPI fails without shunt: $(tail -n 15 "$TMP/mpi-plain.txt")"
mpi LD_PRELOAD="$LIB" SHUNT_RUN_DIR="$TMP/mpirun" SHUNT_STATS_FILE="$TMP/mpi.%p.json" > "$TMP/mpi.txt" 2>&1 \
  || fail "MPI fails under shunt: $(tail -n 25 "$TMP/mpi.txt")"
expect_eq "$(grep -c 'alltoalls verified' "$TMP/mpi.txt")" 2 "MPI ranks verified under shunt"
up=$(cat "$TMP"/mpi.*.json | python3 -c '
import json, sys
dec = json.JSONDecoder(); t = sys.stdin.read(); i = n = 0
while i < len(t):
    t2 = t[i:].lstrip()
    if not t2: break
    d, k = dec.raw_decode(t2); i = len(t) - len(t2) + k
    n += sum(1 for s in d["sockets"] if s["upgraded"] and s["tx_bytes"] + s["rx_bytes"] > 100000)
print(n)')
[ "$up" -ge 2 ] || fail "MPI's data sockets were not MPTCP ($up)"
ok "MPI data sockets were MPTCP ($up)"

# --- iperf3 --bidir, both ends preloaded.
port=$(free_port)
ip netns exec "$(sock_ns h2)" env $(sock_env 2) SHUNT_STATS_FILE="$TMP/iperf-srv.json" \
  iperf3 -s -1 -p "$port" > "$TMP/iperf-srv.txt" 2>&1 &
srv=$!
at_exit "kill $srv 2>/dev/null"
sleep 1
before=$(fab counters --json)
ip netns exec "$(sock_ns h1)" env $(sock_env 1) iperf3 -c 10.0.2.2 -p "$port" --bidir -t 8 -J > "$TMP/iperf.json" &
cli=$!
# Mid-run, h1's agent (the iperf3 client itself) has the live per-subflow
# view and its rails and endpoints: asked every half second from 2 s on
# until both rails' subflows have carried data (its view is the members'
# reports, a second apart; a slow host's second subflow gets going later).
live() {
  SHUNT_RUN_DIR=$TMP/run-h1 "$B/bin/shuntctl" members --json > "$TMP/members.json" || fail "no agent on h1"
  locals=$(jget "$TMP/members.json" 'sorted({f.get("local","").split(":")[0] for m in d["members"].values() for s in m["sockets"] if s.get("mptcp") for f in s["mptcp"]["subflow"] if f["bytes_sent"] > 1000000})')
}
sleep 2
end=$((SECONDS + 5))
live
while [ "$locals" != "['10.0.1.2', '10.1.1.2']" ] && [ $SECONDS -lt $end ]; do
  sleep 0.5
  live
done
python3 - "$TMP/run-h1/agent.sock" > "$TMP/sockets.json" <<'PY' || fail "agent command sockets failed"
import json, socket, sys
s = socket.socket(socket.AF_UNIX); s.connect(sys.argv[1])
s.sendall(b'{"cmd": "sockets"}\n'); print(s.makefile().readline())
PY
wait $cli || fail "iperf3 --bidir fails under shunt"
expect_eq "$locals" "['10.0.1.2', '10.1.1.2']" "live subflows carrying data, by local address"
expect_eq "$(jget "$TMP/sockets.json" '[(r["addr"], r["backup"]) for r in d["rails"]]')" \
  "[('10.0.1.2', False), ('10.1.1.2', False)]" "agent's rails"
expect_eq "$(jget "$TMP/sockets.json" 'sorted((e["addr"], e["port"], e["signal"]) for e in d["endpoints"])')" \
  "[('10.0.1.2', 0, False), ('10.1.1.2', 0, False), ('10.1.1.2', 7473, True)]" "MPTCP endpoints kept by the agent"
after=$(fab counters --json)
wait $srv || fail "iperf3 server failed"
expect_eq "$(jget "$TMP/iperf.json" '"error" in d')" False "iperf3 reports no error"
rates=$(jget "$TMP/iperf.json" '"%.0f %.0f" % (d["end"]["sum_sent"]["bits_per_second"]/1e6, d["end"]["sum_sent_bidir_reverse"]["bits_per_second"]/1e6)')
echo "iperf3 --bidir under shunt: $rates Mbit/s (forward, reverse)"
python3 - "$before" "$after" <<'PY' || fail "iperf3 did not use both rails"
import json, sys
b, a = json.loads(sys.argv[1])["links"], json.loads(sys.argv[2])["links"]
mb = {l: (a[l]["up_bytes"] + a[l]["down_bytes"] - b[l]["up_bytes"] - b[l]["down_bytes"]) / 1e6 for l in ("h1-r0", "h1-r1")}
print("MB per rail during iperf3:", {k: round(v) for k, v in mb.items()})
sys.exit(0 if min(mb.values()) > 5 else 1)
PY
ok "iperf3 --bidir runs unchanged and uses both rails"
