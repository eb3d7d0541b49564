#!/usr/bin/env bash
# timeout: 120
# Source paths: probes that leave from a chosen UDP source port (what a verbs
# bundle's shadow QP uses), each with its own stats. Two namespaces joined by
# one veth link; s1 probes s2 on its rail path (port 7471) and on two source
# paths, from ports 40001 and 40002. The driver is
# clocksync/testing/source_paths_probe.cc, built here against the core
# archive. nft rules in s2's input hook match only a source port:
#  1. Separate stats: a quarter of the packets from port 40002 dropped; only
#     that path shows forward loss, and s2 answers each source path as a
#     reflected path of its own.
#  2. Every packet from port 40001 dropped (a one-way failure): that path is
#     declared dead within SHUNT_PATH_DEAD_MS plus one interval of the rule
#     (the peer's next pair is what shows ours stopped arriving; a failure
#     both ways is seen within the dead time alone), the 40002 path and the
#     rail path stay alive; without the rule it comes back.
set -u
cd "$(dirname "$0")/../.."
. test/e2e/clocksync_lib.bash
B=${BUILD:-build}
CORE=$B/lib/libshunt_core.a
[ -f "$CORE" ] || { echo "build $CORE first (make $CORE)"; exit 77; }
command -v nft >/dev/null || { echo "needs nft (nftables)"; exit 77; }
cs_need_root
TMP=$(mktemp -d /tmp/clocksync-srcport.XXXXXX)
trap 'cs_cleanup; rm -rf "$TMP"' EXIT
fail() { echo "FAIL: $*"; for f in "$TMP"/s*.json; do echo "== $f"; cat "$f"; done; exit 1; }

# The driver: the library's own flags and libraries, from the Makefile.
# A second try: a make running meanwhile may be rewriting the archive.
LIBS=$(make -s --no-print-directory --eval 'cs-print-libs: ; @echo $(LIB_LIBS)' cs-print-libs)
for try in 1 2; do
  g++ -std=c++20 -O1 -D_GNU_SOURCE -DSPDLOG_HEADER_ONLY -DSPDLOG_FMT_EXTERNAL -DFMT_HEADER_ONLY -I. \
    -o "$TMP/probe" clocksync/testing/source_paths_probe.cc \
    -Wl,--whole-archive "$CORE" -Wl,--no-whole-archive $LIBS && break
  [ $try = 2 ] && fail "cannot build the driver"
  sleep 10
done

INTERVAL=100 DEAD=250
A1=10.78.0.1 A2=10.78.0.2
S1=$(cs_ns s1) S2=$(cs_ns s2)
ip netns add "$S1"; ip netns add "$S2"
ip link add v1 netns "$S1" type veth peer name v2 netns "$S2"
ip -n "$S1" addr add $A1/24 dev v1; ip -n "$S2" addr add $A2/24 dev v2
for i in 1 2; do ip -n "$(cs_ns s$i)" link set lo up; ip -n "$(cs_ns s$i)" link set v$i up; done
export SHUNT_JOB_KEY=clocksync-srcport-e2e
ip netns exec "$S1" "$TMP/probe" --name s1 --listen $A1 --peer s2=$A2 --source s2:0:40001 --source s2:0:40002 \
  --interval-ms $INTERVAL --dead-ms $DEAD --duration 60 --status "$TMP/s1.json" --status-ms 50 2>"$TMP/s1.err" &
CS_PIDS+=($!)
ip netns exec "$S2" "$TMP/probe" --name s2 --listen $A2 --peer s1=$A1 \
  --interval-ms $INTERVAL --dead-ms $DEAD --duration 60 --status "$TMP/s2.json" --status-ms 50 2>"$TMP/s2.err" &
CS_PIDS+=($!)

# q HOST PYTHON-EXPR: evaluates EXPR with d = that host's status, src(port),
# refl(port), rail() (its one peer's paths), ev (events); prints the result.
q() {
  python3 - "$TMP/$1.json" "$2" <<'PY'
import json, sys
try:
    d = json.load(open(sys.argv[1]))
except (OSError, ValueError):
    print("None"); sys.exit(0)
p = d["peers"][0] if d["peers"] else {"paths": [], "source_paths": []}
src = lambda port: next((s for s in p["source_paths"] if s["port"] == port and not s["reflected"]), None)
refl = lambda port: next((s for s in p["source_paths"] if s["port"] == port and s["reflected"]), None)
rail = lambda: p["paths"][0] if p["paths"] else None
ev = d["events"]
try:
    print(eval(sys.argv[2]))
except (TypeError, KeyError, IndexError):
    print("None")
PY
}
wait_for() {  # host expr seconds
  local end=$((SECONDS + $3))
  while [ $SECONDS -lt $end ]; do [ "$(q "$1" "$2")" = True ] && return 0; sleep 0.1; done
  return 1
}

wait_for s1 'src(40001)["alive"] and src(40002)["alive"] and rail()["alive"]' 10 ||
  fail "source paths never alive: $(cat "$TMP/s1.err")"
echo "ok: both source paths (ports 40001, 40002) and the rail path alive"
wait_for s1 'min(src(40001)["delay_samples"], src(40002)["delay_samples"], rail()["delay_samples"]) >= 5' 15 ||
  fail "no one-way delays on the source paths"
sleep 1
for port in 40001 40002; do
  echo "   s1 from port $port: $(q s1 "'sent %d received %d fwd p50 %.0f ns rev p50 %.0f ns' % (src($port)['sent'], src($port)['received'], src($port)['fwd_p50_ns'], src($port)['rev_p50_ns'])")"
done
echo "   s1 rail path:       $(q s1 "'sent %d received %d fwd p50 %.0f ns rev p50 %.0f ns' % (rail()['sent'], rail()['received'], rail()['fwd_p50_ns'], rail()['rev_p50_ns'])")"
[ "$(q s1 'src(40001)["received"] > 0 and src(40002)["received"] > 0 and src(40001)["sent"] > 0')" = True ] ||
  fail "source paths without traffic of their own"
ip netns exec "$S2" nft add table inet cs_srcport
ip netns exec "$S2" nft add chain inet cs_srcport in '{ type filter hook input priority 0; }'
ip netns exec "$S2" nft add rule inet cs_srcport in udp sport 40002 numgen random mod 4 == 0 drop
sleep 4
echo "   a quarter of the packets from port 40002 dropped for 4 s:"
for port in 40001 40002; do
  echo "   s1 from port $port: $(q s1 "'forward loss %.3f, reverse loss %.3f, alive %s' % (src($port)['fwd_loss'], src($port)['rev_loss'], src($port)['alive'])")"
done
echo "   s1 rail path:       $(q s1 "'forward loss %.3f, reverse loss %.3f' % (rail()['fwd_loss'], rail()['rev_loss'])")"
[ "$(q s1 'src(40002)["fwd_loss"] > 0.05')" = True ] || fail "no forward loss on the path from port 40002"
[ "$(q s1 'src(40001)["fwd_loss"] < 0.02 and rail()["fwd_loss"] < 0.02')" = True ] ||
  fail "port 40002's loss shows on another path"
[ "$(q s2 'refl(40002)["rev_loss"] > 0.05 and refl(40001)["rev_loss"] < 0.02')" = True ] ||
  fail "s2 does not see the loss on its reflected path for port 40002 alone"
echo "ok: only the path from port 40002 shows the loss (at both ends)"
ip netns exec "$S2" nft flush chain inet cs_srcport in
wait_for s2 'refl(40001) is not None and refl(40001)["alive"] and refl(40002)["alive"] and refl(40001)["id"] == 0' 5 ||
  fail "s2 does not answer the two source paths as reflected paths"
echo "ok: s2 answers them as two reflected paths (ports 40001, 40002), alive"

# Drop only UDP source port 40001 on its way into s2.
wait_for s1 'src(40002)["alive"]' 2 || fail "the path from port 40002 is not alive"
ip netns exec "$S2" nft add rule inet cs_srcport in udp sport 40001 drop
# Counted from when the rule is known to be in: on a loaded host starting
# nft took longer than the bound's margin for jitter.
t0=$(date +%s%N)
wait_for s1 'not src(40001)["alive"]' 5 || fail "the path from port 40001 was never declared dead"
dead_ms=$(q s1 "(next(e['kernel_ns'] for e in ev if e['port'] == 40001 and not e['alive']) - $t0) / 1e6")
echo "ok: path from port 40001 declared dead $(printf %.0f "$dead_ms") ms after the drop rule"
LIMIT=$((DEAD + INTERVAL + INTERVAL / 10))  # the dead time, the peer's next pair (with its jitter)
python3 -c "import sys; sys.exit(0 if float(sys.argv[1]) <= $LIMIT else 1)" "$dead_ms" ||
  fail "dead after $dead_ms ms, limit $LIMIT ms"
sleep 0.5
[ "$(q s1 'src(40002)["alive"] and rail()["alive"]')" = True ] || fail "the other paths did not stay alive"
[ "$(q s1 "not any(e['port'] == 40002 and not e['alive'] and e['kernel_ns'] > $t0 for e in ev)")" = True ] ||
  fail "the path from port 40002 went dead meanwhile"
echo "ok: the path from port 40002 and the rail path stayed alive"

ip netns exec "$S2" nft delete table inet cs_srcport
wait_for s1 'src(40001)["alive"]' 5 || fail "the path from port 40001 did not come back without the rule"
echo "ok: path from port 40001 alive again once the rule is gone"
echo PASS
