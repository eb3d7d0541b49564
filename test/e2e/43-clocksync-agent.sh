#!/usr/bin/env bash
# timeout: 90
# The probe engine inside the host agent, with peers found automatically:
# two hosts (network namespaces joined by one veth link, one probe subnet),
# a preloaded process on each talking TCP to the other (SHUNT_MODE=observe,
# a private SHUNT_RUN_DIR per host, test clocks with known offsets, no
# SHUNT_PEERS). Each host's agent must probe the other (named by address),
# `shuntctl peers --json` must show its offset within its bound of the
# injected truth, and after the link is cut the path must be declared dead
# within its dead time (SHUNT_RAIL_PROBE_EVERY x SHUNT_PATH_DEAD_MS) held 4
# times (the cut silences the peer on its only path: the engine holds a
# peer silent on every path, docs/clocksync.md) and one probe interval, and
# not before the plain dead time. Before the cut, `shuntctl probing` pauses
# both hosts.
set -u
cd "$(dirname "$0")/../.."
. test/e2e/clocksync_lib.bash
B=${BUILD:-build}
LIB=$B/lib/libshunt.so CTL=$B/bin/shuntctl
[ -f "$LIB" ] && [ -x "$CTL" ] || { echo "build $LIB and $CTL first"; exit 77; }
cs_need_root
TMP=$(mktemp -d /tmp/clocksync-agent.XXXXXX)
trap 'cs_cleanup; rm -rf "$TMP"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

INTERVAL=100 DEAD=250 RAIL_EVERY=2  # one rail: a pair every round, dead after 2 x 250 ms
A1=10.77.0.1 A2=10.77.0.2
ip netns add "$(cs_ns a1)"; ip netns add "$(cs_ns a2)"
ip link add v1 netns "$(cs_ns a1)" type veth peer name v2 netns "$(cs_ns a2)"
ip -n "$(cs_ns a1)" addr add $A1/24 dev v1; ip -n "$(cs_ns a2)" addr add $A2/24 dev v2
for i in 1 2; do ip -n "$(cs_ns a$i)" link set lo up; ip -n "$(cs_ns a$i)" link set v$i up; done

OFF[1]=2500000 OFF[2]=-700000   # test clock offsets, ns
run_host() {  # i addr python-code
  mkdir -p "$TMP/run$1"
  ip netns exec "$(cs_ns a$1)" env LD_PRELOAD="$LIB" SHUNT_MODE=observe SHUNT_RUN_DIR="$TMP/run$1" \
    SHUNT_REPORT_INTERVAL_MS=200 SHUNT_PROBE_ADDRS="$2" SHUNT_PROBE_NAME="a$1" SHUNT_PEERS= \
    SHUNT_PROBE_INTERVAL_MS=$INTERVAL SHUNT_PATH_DEAD_MS=$DEAD SHUNT_RAIL_PROBE_EVERY=$RAIL_EVERY SHUNT_JOB_KEY=clocksync-agent-e2e \
    SHUNT_CLOCK_SHM="/${CS_PREFIX}a$1" SHUNT_TEST_CLOCK="offset=${OFF[$1]}" \
    timeout 60 python3 -c "$3" >"$TMP/py$1.log" 2>&1 &
  CS_PIDS+=($!)
}
run_host 2 $A2 "
import socket, time
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(('$A2', 5300)); s.listen(1); c, _ = s.accept()
while c.recv(100): pass
time.sleep(60)"
sleep 0.5
run_host 1 $A1 "
import socket, time
c = socket.create_connection(('$A2', 5300))
for _ in range(600): c.send(b'x'); time.sleep(0.1)"

peers() { SHUNT_RUN_DIR="$TMP/run$1" "$CTL" peers --json 2>/dev/null; }
check() {  # i peer-addr truth -> prints "ok ERR BOUND" once valid and within bound
  peers "$1" | python3 -c '
import json, sys
d = json.load(sys.stdin); d = d.get("peers", d) if isinstance(d, dict) else d
for p in d:
    if p["peer"] != sys.argv[1] or not p["clock"]["valid"]: continue
    err = p["clock"]["offset_ns"] - float(sys.argv[2])
    print(("ok" if abs(err) <= p["clock"]["bound_ns"] else "out"), round(err), round(p["clock"]["bound_ns"]))
' "$2" "$3"
}
for i in 1 2; do
  j=$((3 - i)); peer=10.77.0.$j; truth=$(( OFF[j] - OFF[i] )); res=""
  for _ in $(seq 1 100); do res=$(check $i $peer $truth); [ "${res%% *}" = ok ] && break; sleep 0.1; done
  [ "${res%% *}" = ok ] || { peers $i; fail "a$i: no estimate of $peer within its bound (got: '$res')"; }
  echo "ok: a$i sees $peer (found from its TCP socket): error ${res#ok } ns (error, bound)"
done
# A few more readings: each within its bound.
for _ in 1 2 3 4 5; do
  for i in 1 2; do j=$((3 - i)); r=$(check $i 10.77.0.$j $(( OFF[j] - OFF[i] ))); [ "${r%% *}" = ok ] || fail "a$i: '$r'"; done
  sleep 0.3
done

# A verbs bundle's source paths (bundle-paths, as libshunt asks for them):
# probed from each given UDP source port; asked again with the list after
# a renewal, the ports still listed keep their probes and what their queue
# detector learned, the others go, the new ones come.
python3 - "$TMP/run1/agent.sock" $A1 $A2 <<'PY' || fail "bundle source paths"
import json, socket, sys, time
sock, local, peer = sys.argv[1:]
def ask(req):
    s = socket.socket(socket.AF_UNIX); s.connect(sock); s.sendall(json.dumps(req).encode() + b"\n")
    ans = json.loads(s.makefile().readline()); s.close()
    return ans
key = "e2e-bundle"
def stats():
    ans = ask({"cmd": "bundle-paths-stats", "key": key})
    assert ans.get("ok"), ans
    return {p["port"]: p for p in ans["paths"]}
def until_probed(ports, least=5):
    for _ in range(200):
        st = stats()
        if sorted(st) == sorted(ports) and all(p["alive"] and p["fwd_queue"]["samples"] >= least for p in st.values()):
            return st
        time.sleep(0.1)
    sys.exit(f"source paths {sorted(stats())} not all probed (want {ports}): {stats()}")
ans = ask({"cmd": "bundle-paths", "key": key, "peer": peer, "local": local, "sports": [50001, 50002]})
assert ans.get("ok") and ans["paths"] == 2, ans
# A new port's detector starts from a warmed-up one's (20 samples at once),
# so the kept port must have well over 20 before the renewal for its count
# to tell "kept" from "restarted and seeded".
before = until_probed([50001, 50002], least=26)
ans = ask({"cmd": "bundle-paths", "key": key, "peer": peer, "local": local, "sports": [50002, 50003]})
assert ans.get("ok") and ans["paths"] == 2, ans
after = until_probed([50002, 50003])
kept, new = after[50002]["fwd_queue"]["samples"], after[50003]["fwd_queue"]["samples"]
assert kept >= before[50002]["fwd_queue"]["samples"] and kept >= new + 3, (before[50002], after)
print(f"ok: renewed source paths: 50001 gone, 50003 probed ({new} queue samples), 50002 kept ({kept}, not restarted)")
# Another bundle to the same peer on a port already probed (path discovery
# gives a host's bundles the same ports): it shares that source path (a
# port binds once), which outlives the first bundle's drop.
# Spares (ports that carry nothing) are probed less often; a shared path is
# a spare only while every bundle that holds it calls it one.
ans = ask({"cmd": "bundle-paths", "key": key, "peer": peer, "local": local, "sports": [50002, 50003], "spares": [50003]})
assert ans.get("ok") and ans["paths"] == 2, ans
st = stats()
assert st[50003]["spare"] and not st[50002]["spare"], st
ans = ask({"cmd": "bundle-paths", "key": key + "-2", "peer": peer, "local": local, "sports": [50002], "spares": [50002]})
assert ans.get("ok") and ans["paths"] == 1 and not ans["errors"], ans
assert not stats()[50002]["spare"], stats()
assert ask({"cmd": "bundle-paths-drop", "key": key}).get("ok")
assert "error" in ask({"cmd": "bundle-paths-stats", "key": key})
assert ask({"cmd": "bundle-paths-stats", "key": key + "-2"})["paths"][0]["spare"]
print("ok: spares: a port is probed as one only while every bundle holding it says so")
n0 = ask({"cmd": "bundle-paths-stats", "key": key + "-2"})["paths"][0]["fwd_queue"]["samples"]
for _ in range(80):
    p = ask({"cmd": "bundle-paths-stats", "key": key + "-2"})["paths"][0]
    if p["fwd_queue"]["samples"] > n0 + 2: break
    time.sleep(0.1)
assert p["port"] == 50002 and p["alive"] and p["fwd_queue"]["samples"] > n0 + 2, p
print("ok: a second bundle on port 50002 shares its source path, still probed after the first bundle dropped it")
assert ask({"cmd": "bundle-paths-drop", "key": key + "-2"}).get("ok")
PY

# A pause of probing on both hosts (`shuntctl probing`, to price probing
# inside a running job): bad values are refused with the allowed range; a
# pause sends nothing, and kills no path although it lasts four of its
# dead times; probing comes back after it.
ctl() { local i=$1; shift; SHUNT_RUN_DIR="$TMP/run$i" "$CTL" probing "$@"; }
sent() { peers "$1" | python3 -c 'import json, sys; p = json.load(sys.stdin)["peers"][0]["paths"][0]; print(p["sent"], str(p["alive"]).lower())'; }
out=$(ctl 1 --pause 1000 --every 2000 --count 3 2>&1) && fail "a pause every 2 s (no time to judge between them) was taken: $out"
echo "$out" | grep -q "every_ms must be an integer from 7000" || fail "no range for every_ms: $out"
out=$(ctl 1 --pause 1000 --at 5 2>&1) && fail "a pause in 1970 was taken: $out"
echo "$out" | grep -q "at_unix_ms must be an integer from" || fail "no range for at_unix_ms: $out"
until_ms() { while [ "$(date +%s%3N)" -lt "$1" ]; do sleep 0.05; done; }
at=$(( $(date +%s%3N) + 1000 ))
for i in 1 2; do ctl $i --pause 2000 --at $at --json > "$TMP/pause$i" || fail "a$i: pause refused"; done
grep -q "\"from_unix_ms\": $at" "$TMP/pause1" || fail "pause not as asked: $(cat "$TMP/pause1")"
until_ms $((at + 200)); read -r s0 _ < <(sent 1)
until_ms $((at + 1500)); read -r s1 alive1 < <(sent 1)
[ "$s1" = "$s0" ] || fail "a1 sent probes during the pause ($s0 -> $s1)"
[ "$alive1" = true ] || fail "path a1 -> a2 judged dead during the pause"
until_ms $((at + 2000 + 3000 + 800)); read -r s2 alive2 < <(sent 1)
[ "$alive2" = true ] && [ "$s2" -gt "$s1" ] || fail "after the pause: sent $s1 -> $s2, alive $alive2"
ctl 1 | grep -q "probing paused from $at" || fail "the schedule is not shown: $(ctl 1)"
# Another user neither reads nor pauses (nor changes a bundle's probes):
# the run directory may be open to it (0755), the socket is not.
# (Where that user can run shuntctl at all: a checkout under a private
# directory is out of its reach.)
as_nobody() { setpriv --reuid=65534 --regid=65534 --clear-groups "$@"; }
if command -v setpriv >/dev/null && as_nobody test -x "$CTL"; then
  chmod 711 "$TMP"
  [ "$(stat -c %a "$TMP/run1")" = 755 ] || fail "run directory mode $(stat -c %a "$TMP/run1")"
  nobody() { as_nobody env SHUNT_RUN_DIR="$TMP/run1" "$CTL" "$@" 2>&1; }
  out=$(nobody peers --json) && fail "another user read the peers: $out"
  echo "$out" | grep -q "Permission denied" || fail "another user's read: $out"
  out=$(nobody probing --pause 1000) && fail "another user paused probing: $out"
  echo "$out" | grep -q "Permission denied" || fail "another user's pause: $out"
  echo "ok: another user is refused: $(echo "$out" | head -1)"
fi
ctl 1 --resume | grep -q "no pause" || fail "--resume left a pause"
echo "ok: paused 2 s on both hosts: nothing sent, the path alive throughout, probing again after"

alive() { peers 1 | python3 -c '
import json, sys
d = json.load(sys.stdin); d = d.get("peers", d) if isinstance(d, dict) else d
print(next((str(p["paths"][0]["alive"]).lower() for p in d if p["peer"] == sys.argv[1]), "none"))' "$1"; }
[ "$(alive $A2)" = true ] || fail "path a1 -> a2 not alive before the cut"
# One peer with one path on a1: the first "alive" in the answer is that path.
# Polled with shuntctl and grep only, so the polling adds little to the time;
# for up to 10 s by the clock (400 polls took 1.8 s on a fast host, less
# than the dead time).
t0=$(date +%s%N)
ip -n "$(cs_ns a1)" link set v1 down
dead_ms=""
while (( ($(date +%s%N) - t0) / 1000000 < 10000 )); do
  if peers 1 | grep -q '"alive": *false'; then dead_ms=$(( ($(date +%s%N) - t0) / 1000000 )); break; fi
done
[ -n "$dead_ms" ] || fail "path never declared dead"
echo "ok: path a1 -> a2 declared dead ${dead_ms} ms after the cut (as seen through shuntctl)"
limit=$((4 * RAIL_EVERY * DEAD + INTERVAL))
[ "$dead_ms" -le $((limit + 50)) ] || fail "dead after $dead_ms ms, limit $limit ms (+50 ms for shuntctl)"
[ "$dead_ms" -gt $((RAIL_EVERY * DEAD)) ] || fail "dead after $dead_ms ms: a silent peer was not held"
echo PASS
