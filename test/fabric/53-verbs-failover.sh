#!/usr/bin/env bash
# timeout: 600
# Hitless failover on one rail: shunt-bench (all-to-all, write_imm and
# send, -c 1) on 2 guests while, for 12 s, h1's leaf drops every packet of
# the job's own QP (its UDP source port, learnt from the traffic) and the
# link to spine s1 is black-holed; then both heal. Without libshunt the job
# fails (retry exceeded); with it, every path that crossed s1 and the
# application's QP fail over: one-sided work is posted again on live shadows, two-sided work moves
# to a shadow both ends agree on, exactly the messages the peer did not
# consume are sent again, and failed paths are renewed on new source ports.
# Checked: exit 0, #wrong 0, no error seen by the application, every
# message sent by one end received by the other (counted by both shims),
# and at least one failover of the application's own QP.
. "$(dirname "$0")/lib.sh"
need_guests
BENCH=$B/bin/shunt-bench
up --hosts 2 --rails 2 --spines 2
boot=$(fab addr h1 r1):29913  # the job's TCP bootstrap rides rail 1; the fault is on rail 0
KEY=fo-$$

leaf=sf-$NAME-l1r0
a1=$(fab addr h1 r0)
learn_sports t53 "$leaf" "$a1" || fail "nft on the leaf"
seen() { seen_sports t53 "$leaf"; }

# run TAG VERB MODE(with|without) [SPREAD]: the job, faulted 4 s in for 12 s
run() {
  local tag=$1 verb=$2 mode=$3 spread=${4:-pin} env=(env) r pids=()
  [ "$mode" = with ] && env=(env LD_PRELOAD="$LIB" SHUNT_MODE=active SHUNT_JOB_KEY="$KEY" SHUNT_LOG_LEVEL=info
    SHUNT_SPREAD="$spread" SHUNT_STATS_FILE=/tmp/$tag-stats.json)
  ip netns exec "$leaf" nft flush set ip t53 seen
  for r in 1 0; do
    local extra=()
    [ $r = 0 ] && extra=(--ready-file /tmp/$tag.ready)
    fab exec h$((r + 1)) -- timeout 150 "${env[@]}" "$BENCH" --rank $r --world 2 --bootstrap "$boot" \
      --transport verbs -d rxe0 --verb "$verb" -b 1M -e 1M -w 2 -c 1 --seg 64K --duration 60 --stop-file /tmp/$tag.stop \
      --stall-timeout 20 --retry-cnt 6 --qp-timeout 14 "${extra[@]}" > "$TMP/$tag.rank$r.out" 2>&1 &
    pids+=($!)
  done
  for _ in $(seq 300); do fab exec h1 -- test -e /tmp/$tag.ready 2>/dev/null && break; sleep 0.2; done
  sleep 4
  # with libshunt: the shadows' ports are known once the bundle's "active"
  # line is here (the guest's output can reach this file seconds after the
  # shadows carried their first probes, on a busy host)
  if [ "$mode" = with ]; then
    for _ in $(seq 120); do grep -q "UDP source ports" "$TMP/$tag.rank0.out" && break; sleep 0.5; done
  fi
  local shadows ports p own=
  shadows=$(sed -n 's/.*UDP source ports \([0-9,]*\)).*/\1/p' "$TMP/$tag.rank0.out" | tr ',' ' ')
  ports=$(seen)
  for p in $ports; do [[ " $shadows " == *" $p "* ]] || own+="$p "; done
  echo "$tag: h1's RoCE source ports $(echo $ports); shadows: ${shadows:-none}; the job's own QP: $own"
  [ "$(echo $own | wc -w)" = 1 ] || fail "$tag: cannot tell the job's own QP's source port"
  note "$tag: dropping h1's port $own and black-holing l1r0-s1 for 12 s"
  ip netns exec "$leaf" nft add rule ip t53 cut ip saddr "$a1" udp sport "$own" drop || fail "nft drop"
  fab fault blackhole l1r0-s1 >/dev/null || fail "blackhole"
  sleep 12
  ip netns exec "$leaf" nft flush chain ip t53 cut
  fab fault unblackhole l1r0-s1 >/dev/null || fail "unblackhole"
  # the host agent's metrics, while the job still runs
  [ "$mode" = with ] && fab exec h1 -- curl -sS -m 5 http://127.0.0.1:9471/metrics > "$TMP/$tag.metrics" 2>&1
  # the job runs until here (the fab exec calls take seconds on a busy host)
  fab exec h1 -- touch /tmp/$tag.stop
  local rc=0
  for p in "${pids[@]}"; do wait "$p" || rc=$?; done
  echo $rc > "$TMP/$tag.rc"
}

run base write_imm without
echo "without libshunt: exit $(cat $TMP/base.rc)"
grep -h "error" "$TMP"/base.rank*.out | head -3
[ "$(cat $TMP/base.rc)" != 0 ] || fail "the job without libshunt survived the black hole: the fault missed it"

# write_imm with its WRITEs spread over the shadows (their replays when
# shadows fail), send with everything on one path (the default)
for verb in write_imm send; do
  tag=fo-$verb
  spread=pin; [ $verb = write_imm ] && spread=flowlet
  run $tag $verb with $spread
  for r in 0 1; do
    out=$TMP/$tag.rank$r.out
    grep -E "moved|failed|back in service|no path" "$out" | sed "s/^/  rank $r: /" | head -12
    ! grep -q "shunt-bench: rank $r: error" "$out" || { cat "$out"; fail "$verb: rank $r saw an error"; }
  done
  out=$TMP/$tag.rank0.out  # rank 0 prints the results
  grep -qE "^# Errors seen +: 0$" "$out" || { cat "$out"; fail "$verb: errors seen"; }
  rows=$(awk '$1 ~ /^[0-9]+$/ && NF >= 13' "$out" | wc -l)
  awk '$1 ~ /^[0-9]+$/ && NF >= 13 && $9 != 0 { bad = 1 } END { exit bad }' "$out" && [ "$rows" -ge 1 ] ||
    { cat "$out"; fail "$verb: #wrong is not 0 (or no result)"; }
  [ "$(cat $TMP/$tag.rc)" = 0 ] || { cat "$TMP/$tag.rank0.out"; fail "$verb: the job failed with libshunt"; }
  fab exec h1 -- cat /tmp/$tag-stats.json > "$TMP/s0.json"
  fab exec h2 -- cat /tmp/$tag-stats.json > "$TMP/s1.json"
  b() { jget "$TMP/s$1.json" "[q['bundle'] for q in d['verbs']['qps'] if q.get('bundle')][0]['$2']"; }
  echo "$verb: h1 sent $(b 0 messages_sent), h2 received $(b 1 messages_received);" \
    "h2 sent $(b 1 messages_sent), h1 received $(b 0 messages_received);" \
    "failovers $(b 0 failovers)/$(b 1 failovers), moves $(b 0 moves)/$(b 1 moves)," \
    "replayed $(b 0 replayed)/$(b 1 replayed) WRs, $(b 0 replayed_bytes)/$(b 1 replayed_bytes) bytes, errors hidden $(b 0 errors_hidden)/$(b 1 errors_hidden)"
  [ "$(b 0 messages_sent)" = "$(b 1 messages_received)" ] || fail "$verb: h1's messages not all received once"
  [ "$(b 1 messages_sent)" = "$(b 0 messages_received)" ] || fail "$verb: h2's messages not all received once"
  [ "$(b 0 moves)" -ge 1 ] || fail "$verb: the application's QP never failed over (the fault missed it?)"
  [ "$(b 0 primary_down)" = True ] || fail "$verb: the application's QP was not taken out of service"
  grep -E '^shunt_(failovers_total|replays_total|bundles)\{' "$TMP/$tag.metrics" | grep -v ' 0$' | head -4
  grep -qE '^shunt_failovers_total(\{.*\})? [1-9]' "$TMP/$tag.metrics" || { grep -E "^shunt_(failovers|bundles|events_total|processes)" "$TMP/$tag.metrics" | head -20; tail -c 600 "$TMP/$tag.metrics"; fail "$verb: no failover in the agent's metrics"; }
  grep -qE '^shunt_bundles\{.*state="degraded".*\} [1-9]' "$TMP/$tag.metrics" ||
    fail "$verb: the agent's metrics show no degraded bundle"
done
echo "ok: the job survived a black-holed spine, every message exactly once"
