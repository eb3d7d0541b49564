#!/usr/bin/env bash
# timeout: 300
# Path discovery (SHUNT_PATH_DISCOVERY_MS) on soft-RoCE guests: 2 hosts on
# their own leaves, 2 spines hashing the 5-tuple. A split job with 8
# shadows per QP (-c 1):
# - at both ends (the side that sets the bundle up and the side that
#   answers it, whose shadows carry its own data), each shadow's port was
#   answered for by one of exactly two routers (the spines, 2 hops out),
#   4 shadows each;
# - the fabric agrees: an nft set on s1 records the source ports of the
#   RoCE packets it really forwarded, and each end's shadows one router
#   answered for all crossed s1, the other router's none of them;
# - each end learned its application QP's router too (split balances the
#   routers' bytes with the carrier's own), and the fabric agrees;
# - two jobs started at once on the same hosts are both placed 4:4, on the
#   same ports (the host agent sends one round of datagrams for both);
# - with one spine's ICMP to h1's leaf queued (its answers come after
#   SHUNT_PATH_DISCOVERY_MS), discovery waits on for them, and h1's shadows
#   are still placed 4:4;
# - the same job with SHUNT_PATH_DISCOVERY_MS=0 is shown for comparison
#   (where the hash alone puts its shadows).
. "$(dirname "$0")/lib.sh"
need_guests
BENCH=$B/bin/shunt-bench
[ -f "$LIB" ] || fail "no $LIB (make)"
command -v nft >/dev/null || skip "no nft"
up --hosts 2 --rails 1 --spines 2
KEY=discovery-$$
a1=$(fab addr h1 r0)
sport_watch

# job_start TAG PORT [VAR=VALUE...]: both ranks in the background (PIDS)
PIDS=()
job_start() {
  local tag=$1 port=$2 r
  shift 2
  for r in 1 0; do
    fab exec "h$((r + 1))" -- timeout 120 env LD_PRELOAD="$LIB" SHUNT_MODE=active SHUNT_SPREAD=split \
      SHUNT_SPLIT_MIN_BYTES=65536 SHUNT_JOB_KEY="$KEY" SHUNT_PATHS_PER_RAIL=8 SHUNT_LOG_LEVEL=info \
      SHUNT_STATS_FILE="/tmp/$tag$r.json" "$@" "$BENCH" --rank $r --world 2 --bootstrap "$a1:$port" \
      --transport verbs -d rxe0 --verb write_imm -b 256K -e 256K --duration 6 -w 4 -c 1 --seg 256K \
      > "$TMP/$tag$r.out" 2>&1 &
    PIDS+=($!)
  done
}
job_wait() {  # TAG...
  local p tag
  for p in "${PIDS[@]}"; do wait "$p" || { cat "$TMP/"*.out; fail "$*: a rank failed"; }; done
  PIDS=()
  for tag in "$@"; do
    grep -v '^#' "$TMP/${tag}0.out" | awk '$1 ~ /^[0-9]+$/ && NF == 13 { n++; if ($9 != 0) bad = 1 } END { exit bad || !n }' ||
      { cat "$TMP/${tag}0.out"; fail "$tag: #wrong not 0"; }
    fab exec h1 -- cat "/tmp/${tag}0.json" > "$TMP/$tag.json" || fail "$tag: no stats"
  done
}
job() { job_start "$@"; job_wait "$1"; }

note "discovery on (the default)"
job on 29931
fab exec h2 -- cat /tmp/on1.json > "$TMP/on-h2.json" || fail "no stats of h2"
grep "shadows over" "$TMP/on0.out" || { cat "$TMP/on0.out"; fail "no discovery line"; }
grep "shadows over" "$TMP/on1.out" || { cat "$TMP/on1.out"; fail "no discovery line at the answering end"; }
# placed END STATS [prim]: END's shadows 4:4 over two routers, as the
# fabric saw them; with prim, the application QP's router as well
placed() {
  local a on_s1
  a=$(fab addr "$1" r0)
  on_s1=$(sport_seen s1 roce | tr ' ' '\n' | sed -n "s/^$a://p" | sort -n | tr '\n' ' ')
  echo "$1's ports seen on s1: $on_s1"
  python3 - "$2" "$on_s1" "${3:-}" <<'PY' || fail "discovery at $1"
import json, sys
on_s1 = {int(p) for p in sys.argv[2].split()}
b = next(q["bundle"] for q in json.load(open(sys.argv[1]))["verbs"]["qps"] if q.get("bundle") and q["bundle"]["paths"])
paths = b["paths"]
routers = {}
for p in paths:
    routers.setdefault(p["router"], []).append(p["udp_sport"])
for r, ports in sorted(routers.items()):
    print("router %s: ports %s, on s1: %s" % (r or "(none)", ports, [p in on_s1 for p in ports]))
assert len(paths) == 8, "8 shadows, not %d" % len(paths)
assert "" not in routers, "a shadow without a router"
assert len(routers) == 2, "two routers, not %d" % len(routers)
assert sorted(len(v) for v in routers.values()) == [4, 4], "4 shadows per router"
for r, ports in routers.items():
    seen = {p in on_s1 for p in ports}
    assert len(seen) == 1, "router %s's shadows crossed both spines" % r
assert len({all(p in on_s1 for p in v) for v in routers.values()}) == 2, "both routers' shadows on one spine"
if sys.argv[3]:
    pr, port = b["primary"].get("router"), b["primary"].get("udp_sport")
    print("application QP: port %s, router %s, on s1: %s" % (port, pr or "(none)", port in on_s1))
    assert pr, "the application QP's router was not learned"
    assert pr in routers, "the application QP's router is none of the shadows'"
    assert (port in on_s1) == all(p in on_s1 for p in routers[pr]), "the application QP's router disagrees with the fabric"
PY
}
placed h1 "$TMP/on.json" prim
placed h2 "$TMP/on-h2.json" prim

note "two jobs at once on the same hosts: the host agent's one round of datagrams serves both"
# Routers answer a burst of about 6 ICMP messages per destination host: two
# bundles each sending 24 datagrams at once would leave the second one's
# ports mostly unanswered (placed by the hash).
job_start two-a 29933
job_start two-b 29934
job_wait two-a two-b
python3 - "$TMP/two-a.json" "$TMP/two-b.json" <<'EOF' || fail "two jobs at once"
import json, sys
placed = []
for f in sys.argv[1:]:
    b = next(q["bundle"] for q in json.load(open(f))["verbs"]["qps"] if q.get("bundle") and q["bundle"]["paths"])
    routers = {}
    for p in b["paths"]:
        routers.setdefault(p["router"], []).append(p["udp_sport"])
    print("%s: %s" % (f.rsplit("/", 1)[-1], {r or "(none)": len(v) for r, v in sorted(routers.items())}))
    assert "" not in routers and sorted(len(v) for v in routers.values()) == [4, 4], "not 4 shadows on each of 2 routers"
    placed.append(sorted(p["udp_sport"] for p in b["paths"]))
assert placed[0] == placed[1], "the two bundles did not share the host's discovered ports"
print("both bundles: 4 shadows per router, on the same %d ports" % len(placed[0]))
EOF

note "one spine's answers come late (a queue): discovery waits for them"
# On s2's link down to h1's leaf, ICMP (and datagrams to port 9) go
# through a 1 Mbit/s class (htb; other traffic passes as before), kept
# about half a second deep by datagrams from s2 to h1's port 9 (50 at once,
# then about the class's rate). s2's answers to discovery's datagrams wait
# in that queue, past the 100 ms of SHUNT_PATH_DISCOVERY_MS, while s1's
# come at once: waiting only that long, h1 heard one router and left its
# shadows to the hash. It waits on (up to ten times as long) for a second
# router. The queue goes once the bundle is up.
sx() { ip netns exec "sf-$NAME-s2" "$@"; }
sx tc qdisc replace dev l1r0 root handle 1: htb default 20 &&
  sx tc class add dev l1r0 parent 1: classid 1:10 htb rate 1mbit ceil 1mbit &&
  sx tc class add dev l1r0 parent 1: classid 1:20 htb rate 10gbit 2>/dev/null &&
  sx tc filter add dev l1r0 parent 1: protocol ip prio 1 u32 match ip protocol 1 0xff flowid 1:10 &&
  sx tc filter add dev l1r0 parent 1: protocol ip prio 2 u32 match ip protocol 17 0xff match ip dport 9 0xffff flowid 1:10 ||
  fail "ICMP queue on s2"
ip netns exec "sf-$NAME-s2" timeout 90 python3 -c '
import socket, sys, time
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
for _ in range(50):
    s.sendto(bytes(1000), (sys.argv[1], 9))
t = time.monotonic()
while True:  # 1000 B + headers every 8.5 ms: about 1 Mbit/s
    t += 0.0085
    time.sleep(max(0, t - time.monotonic()))
    s.sendto(bytes(1000), (sys.argv[1], 9))' "$a1" &
FILL=$!
sleep 1
job_start late 29935
for ((i = 0; i < 300; i++)); do grep -q "bundle active" "$TMP/late0.out" 2>/dev/null && break; sleep 0.1; done
kill "$FILL"; wait "$FILL" 2>/dev/null
sx tc qdisc del dev l1r0 root || fail "ICMP queue on s2 off"
job_wait late
grep "shadows over" "$TMP/late0.out" || { cat "$TMP/late0.out"; fail "no discovery line"; }
placed h1 "$TMP/late.json"

note "discovery off, for comparison"
job off 29932 SHUNT_PATH_DISCOVERY_MS=0
on_s1=$(sport_seen s1 roce | tr ' ' '\n' | sed -n "s/^$a1://p" | sort -n | tr '\n' ' ')
python3 - "$TMP/off.json" "$on_s1" <<'EOF' || fail "discovery off"
import json, sys
on_s1 = {int(p) for p in sys.argv[2].split()}
b = next(q["bundle"] for q in json.load(open(sys.argv[1]))["verbs"]["qps"] if q.get("bundle") and q["bundle"]["paths"])
ports = [p["udp_sport"] for p in b["paths"]]
n = sum(p in on_s1 for p in ports)
print("without discovery: %d of the 8 shadows crossed s1, %d s2 (the hash's luck)" % (n, 8 - n))
assert all(not p["router"] for p in b["paths"]), "a router known with discovery off"
EOF
echo ok
