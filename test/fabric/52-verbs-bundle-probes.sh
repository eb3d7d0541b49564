#!/usr/bin/env bash
# timeout: 400
# Probes that follow a bundle's paths, renewed ones included: on a fabric
# whose routers hash on addresses and source port only (shunt-fabric
# --ecmp-hash sport), each shadow QP's UDP source port is also probed by
# the host agent's probe engine (a clocksync source path) from the
# shadow's own NIC, so its liveness and one-way delay are those of the
# shadow's own path. Two rails: the bundle has shadows on both NICs, and
# h1's rail-0 leaf loses its spine links for 3 s, so the rail-0 shadows
# fail (idle ones by their lost probes) and are renewed on new source
# ports. Checked: a path failed for its lost probes; every shadow port of both
# ends, on both rails, renewed ones included, has a live source path in
# `shuntctl peers`, and on the spines every shadow's (address, source
# port) was seen probing on the spine that carried its RoCE packets and on
# no other. The application's QPs too: shunt gives them a flow label, so
# their ports are known and probed, and they fail by their lost probes.
. "$(dirname "$0")/lib.sh"
need_guests
BENCH=$B/bin/shunt-bench
command -v nft >/dev/null || skip "no nft"
up --hosts 2 --rails 2 --spines 2 --ecmp-hash sport
KEY=probes-$$
a1=$(fab addr h1 r0); a2=$(fab addr h2 r0)
declare -A addr=([h1rxe0]=$a1 [h2rxe0]=$a2 [h1rxe1]=$(fab addr h1 r1) [h2rxe1]=$(fab addr h2 r1))
sport_watch

# rank R on host H (address A)
rank() {
  fab exec "$2" -- timeout 150 env LD_PRELOAD="$LIB" SHUNT_MODE=active SHUNT_SPREAD=flowlet SHUNT_JOB_KEY="$KEY" SHUNT_PATHS_PER_RAIL=4 \
    SHUNT_PROBE_ADDRS="$3" SHUNT_PROBE_INTERVAL_MS=50 SHUNT_LOG_LEVEL=info SHUNT_STATS_FILE="/tmp/p$1.json" \
    "$BENCH" --rank "$1" --world 2 --bootstrap "$a1:29911" --transport verbs -d rxe0 --verb write_imm \
    -b 1M -e 1M --duration 90 --stop-file /tmp/probes.stop -w 1 -c 1 --seg 256K > "$TMP/rank$1.out" 2>&1
}
rank 1 h2 "$a2,${addr[h2rxe1]}" &
r1=$!
rank 0 h1 "$a1,${addr[h1rxe1]}" &
r0=$!
# Once every source path of both ends is alive (the bundle's set-up takes
# a varying while on these guests; a fault before the rail-0 paths were
# ever alive fails them by retries, not by lost probes), h1's rail-0 leaf
# loses both its spine links for 3 s: every rail-0 path of both ends fails
# (the job goes on over rail 1) and is renewed on a new source port once
# the links are back; the renewed ports must be probed too. Then both
# agents' views of their source paths, while the job still runs: it runs
# until the stop file is there (rank 0 checks it), 90 s at most.
all_alive() {  # HOST: its 9 own source paths (4 shadows per rail and the application QP) alive
  fab exec "$1" -- "$B/bin/shuntctl" peers --json > "$TMP/early-$1.json" 2>/dev/null || return 1
  [ "$(jget "$TMP/early-$1.json" "sum(1 for pr in d['peers'] for sp in pr['source_paths'] if not sp['reflected'] and sp['alive'])" 2>/dev/null)" -ge 9 ] 2>/dev/null
}
end=$((SECONDS + 60))
until all_alive h1 && all_alive h2; do
  [ $SECONDS -lt $end ] || {
    for r in 0 1; do echo "rank $r:"; grep -h "clocksync\|shunt warning\|bundle active" "$TMP/rank$r.out" | head -60; done
    for h in h1 h2; do
      echo "$h's source paths (peer rail port reflected alive sent received):"
      jget "$TMP/early-$h.json" "'\\n'.join('  %s %s %s %s %s %s %s' % (pr['peer'], sp['rail'], sp['port'], sp['reflected'], sp['alive'], sp.get('sent'), sp.get('received')) for pr in d['peers'] for sp in pr['source_paths'])" 2>&1
    done
    fail "the source paths were not all alive within 60 s"
  }
  sleep 0.5
done
for s in s1 s2; do fab fault blackhole l1r0-$s >/dev/null || fail "blackhole l1r0-$s"; done
sleep 3
for s in s1 s2; do fab fault unblackhole l1r0-$s >/dev/null || fail "unblackhole l1r0-$s"; done
sleep 9
for h in h1 h2; do
  fab exec $h -- "$B/bin/shuntctl" peers --json > "$TMP/peers-$h.json" || fail "shuntctl peers on $h"
done
fab exec h1 -- touch /tmp/probes.stop
wait $r0 || { cat "$TMP/rank0.out"; fail "rank 0 failed"; }
wait $r1 || { cat "$TMP/rank1.out"; fail "rank 1 failed"; }
grep -q "bundle active with 4 shadow paths.* and 4 on other NICs" "$TMP/rank0.out" || { cat "$TMP/rank0.out"; fail "no bundle on both rails"; }

for h in h1 h2; do
  r=$([ $h = h1 ] && echo 0 || echo 1)
  fab exec $h -- cat /tmp/p$r.json > "$TMP/p$r.json"
  sports=$(jget "$TMP/p$r.json" '" ".join("%s/%s" % (p["device"], p["udp_sport"]) for q in d["verbs"]["qps"] if "bundle" in q for p in q["bundle"]["paths"])')
  echo "$h shadow ports: $sports"
  [ -n "$sports" ] || fail "$h: no shadow ports"
  for dp in $sports; do
    dev=${dp%/*} p=${dp#*/} rail=${dp%%/*}; rail=${rail#rxe}
    alive=$(jget "$TMP/peers-$h.json" "[sp['alive'] for pr in d['peers'] for sp in pr['source_paths'] if sp['port'] == $p and sp['rail'] == $rail and not sp['reflected']]")
    echo "  $h source path from $dev port $p: alive $alive"
    [ "$alive" = "[True]" ] || fail "$h: source path from $dev port $p not alive: $alive"
    echo "${addr[$h$dev]}:$p" >> "$TMP/all-sports"
  done
done
grep -q "^${addr[h1rxe1]}:" "$TMP/all-sports" || fail "no shadow on rail 1"
first=$(sed -n 's/.*bundle active with 4 shadow paths (UDP source ports \([0-9,]*\)).*/\1/p' "$TMP/rank0.out" | head -1)
renewed=$(grep "^$a1:" "$TMP/all-sports" | cut -d: -f2 | while read -r p; do [[ ",$first," == *",$p,"* ]] || echo "$p"; done | xargs)
echo "h1's rail-0 shadows at setup: $first; renewed on new ports since: ${renewed:-none}"
[ -n "$renewed" ] || fail "no rail-0 shadow of h1 was renewed on a new port: the fault missed them"
# idle shadows too: their probes, not their work, find the dead route
grep -h "failed (its own probes are lost" "$TMP"/rank*.out | head -3
grep -q "failed (its own probes are lost" "$TMP"/rank*.out || fail "no path failed for its lost probes"

# The application's own QPs: shunt gave each a flow label at RTR, so its
# source port is known and probed too (checked on the spines below), and
# they failed in the fault by their lost probes, before any retransmission
# could tell (the retry count is 7: they never fail by retries). Both ends'
# probes are lost at about the same time; the end that finds it first
# moves the two-sided work off its QP, and that move takes the other end's
# QP out of service too (no failure of its own to log). So: one end's
# failed by its lost probes, and both ends' are out of service.
for r in 0 1; do
  prim=$(jget "$TMP/p$r.json" '" ".join(str(q["bundle"]["primary"]["udp_sport"]) for q in d["verbs"]["qps"] if "bundle" in q and q["bundle"]["paths"])')
  echo "rank $r: application QP's source port $prim"
  [[ $prim =~ ^[0-9]+$ ]] || fail "rank $r: the application QP's source port is not known: $prim"
  echo "${addr[h$((r + 1))rxe0]}:$prim" >> "$TMP/all-sports"
done
grep -h "path primary failed" "$TMP"/rank*.out | head -2
grep -q "path primary failed (its own probes are lost" "$TMP"/rank*.out ||
  fail "neither end's application QP failed by its lost probes"
for r in 0 1; do
  down=$(jget "$TMP/p$r.json" '[q["bundle"]["primary_down"] for q in d["verbs"]["qps"] if "bundle" in q and q["bundle"]["paths"]]')
  [ "$down" = "[True]" ] || fail "rank $r: the application QP is still in service after the fault: $down"
done

declare -A roce probe
for s in s1 s2; do roce[$s]=" $(sport_seen $s roce) "; probe[$s]=" $(sport_seen $s probe) "; done
checked=0
for p in $(cat "$TMP/all-sports"); do
  where_roce="" where_probe=""
  for s in s1 s2; do
    [[ ${roce[$s]} == *" $p "* ]] && where_roce+="$s"
    [[ ${probe[$s]} == *" $p "* ]] && where_probe+="$s"
  done
  echo "$p: RoCE via ${where_roce:-none}, probes via ${where_probe:-none}"
  if grep -qx "$p" <(tail -2 "$TMP/all-sports"); then  # an application QP: it carried the job's two-sided work
    [ -n "$where_roce" ] || fail "$p: the application QP's packets were not seen with its port"
  fi
  [ -z "$where_roce" ] && continue  # a shadow that carried nothing yet
  [ "$where_roce" = "$where_probe" ] || fail "$p: RoCE via $where_roce but probes via ${where_probe:-none}"
  checked=$((checked + 1))
done
[ $checked -ge 2 ] || fail "only $checked shadow ports carried RoCE traffic"
echo "ok: $checked shadow paths, each probed along its own spine"
