#!/usr/bin/env bash
# timeout: 240
# Every protection with nothing but the job key set (as shunt-run sets it):
# no SHUNT_PROBE_ADDRS, no SHUNT_SOCKET_RAILS. On two guests with two rails
# (soft-RoCE on each), each host agent finds its rails behind its active
# RoCE ports (both rails' addresses, in rail order, and nothing else), its
# probe engine runs on them, the sockets' MPTCP rails are the same two, and
# a verbs job's bundle paths are probed (source paths alive on both rails).
. "$(dirname "$0")/lib.sh"
need_guests
BENCH=$B/bin/shunt-bench
up --hosts 2 --rails 2 --spines 2 --ecmp-hash sport
KEY=defaults-$$
a1=$(fab addr h1 r0)
rank() {  # RANK HOST
  fab exec "$2" -- timeout 120 env LD_PRELOAD="$LIB" SHUNT_JOB_KEY="$KEY" SHUNT_LOG_LEVEL=info \
    "$BENCH" --rank "$1" --world 2 --bootstrap "$a1:29913" --transport verbs -d rxe0 --verb write_imm \
    -b 256K -e 256K --duration 60 --stop-file /tmp/defaults.stop -w 1 -c 1 > "$TMP/rank$1.out" 2>&1
}
rank 1 h2 & r1=$!
rank 0 h1 & r0=$!
# source paths of this host's own bundle paths, alive
alive_paths() {
  fab exec "$1" -- "$B/bin/shuntctl" peers --json > "$TMP/peers-$1.json" 2>/dev/null || { echo 0; return; }
  jget "$TMP/peers-$1.json" "sum(1 for pr in d['peers'] for sp in pr['source_paths'] if not sp['reflected'] and sp['alive'])" 2>/dev/null || echo 0
}
end=$((SECONDS + 60))
until [ "$(alive_paths h1)" -ge 4 ] && [ "$(alive_paths h2)" -ge 4 ]; do
  [ $SECONDS -lt $end ] || {
    for r in 0 1; do echo "rank $r:"; grep -h "probe engine\|clocksync\|sockets:\|shunt warning\|bundle active" "$TMP/rank$r.out" | head -30; done
    fail "no four live source paths on each host within 60 s"
  }
  sleep 1
done
for h in h1 h2; do
  want="$(fab addr $h r0),$(fab addr $h r1)"
  fab exec $h -- "$B/bin/shuntctl" sockets --json > "$TMP/sockets-$h.json" || fail "shuntctl sockets on $h"
  expect_rails=$(jget "$TMP/peers-$h.json" "','.join(d['probing']['rails'])")
  [ "$expect_rails" = "$want" ] || fail "$h: probe rails $expect_rails, want $want"
  [ "$(jget "$TMP/peers-$h.json" "d['probing']['rails_from']")" = "RoCE ports" ] || fail "$h: rails not from the RoCE ports"
  [ "$(jget "$TMP/peers-$h.json" "d['probing']['running']")" = True ] || fail "$h: probe engine not running"
  socket_rails=$(jget "$TMP/sockets-$h.json" "','.join(r['addr'] for r in d['rails'])")
  [ "$socket_rails" = "$want" ] || fail "$h: socket rails $socket_rails, want $want"
  on_rail1=$(jget "$TMP/peers-$h.json" "sum(1 for pr in d['peers'] for sp in pr['source_paths'] if not sp['reflected'] and sp['alive'] and sp['rail'] == 1)")
  [ "$on_rail1" -ge 1 ] || fail "$h: no live source path on rail 1"
  echo "ok: $h: probe engine on $expect_rails (RoCE ports), socket rails $socket_rails, $(alive_paths $h) live source paths, $on_rail1 on rail 1"
done
fab exec h1 -- "$B/bin/shuntctl" peers | head -3
fab exec h1 -- touch /tmp/defaults.stop
wait $r0 || { tail -20 "$TMP/rank0.out"; fail "rank 0 failed"; }
wait $r1 || { tail -20 "$TMP/rank1.out"; fail "rank 1 failed"; }
grep -h "probe engine:" "$TMP/rank0.out" | head -2
