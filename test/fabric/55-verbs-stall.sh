#!/usr/bin/env bash
# timeout: 420
# A dead route under a QP that retries forever: shunt-bench (send, -c 1,
# retry count 7, which rdma_rxe retries without end) on 2 guests while h1's
# leaf drops every packet of the job's own QP (its UDP source port, learnt
# from the traffic; the shadows' ports pass). No error completion ever
# comes: without libshunt the job hangs until its own stall timeout kills
# it; with it, the stall watch sees the QP complete nothing while rxe
# retransmits (SHUNT_STALL_MS), and both ends move their two-sided work to
# a shadow. Checked: exit 0, #wrong 0, no error seen, every message
# received once (both shims' counts), the move made for a stall.
. "$(dirname "$0")/lib.sh"
need_guests
BENCH=$B/bin/shunt-bench
up --hosts 2 --rails 2 --spines 2
boot=$(fab addr h1 r1):29915  # the job's bootstrap rides rail 1; the fault is on rail 0
KEY=stall-$$
leaf=sf-$NAME-l1r0
a1=$(fab addr h1 r0)
learn_sports t55 "$leaf" "$a1" || fail "nft on the leaf"

# run TAG MODE(with|without): the job, its own QP's packets dropped 3 s in
run() {
  local tag=$1 mode=$2 env=(env) r p pids=()
  # SHUNT_PROBE_ADDRS=none: the stall watch alone (the probes, on by
  # default, leave from the QP's own port and would find the route first)
  [ "$mode" = with ] && env=(env LD_PRELOAD="$LIB" SHUNT_MODE=active SHUNT_JOB_KEY="$KEY" SHUNT_LOG_LEVEL=info
    SHUNT_PROBE_ADDRS=none SHUNT_STALL_MS=2000 SHUNT_STATS_FILE=/tmp/$tag-stats.json SHUNT_METRICS_TEXTFILE=/tmp/$tag.prom
    SHUNT_METRICS_INTERVAL_MS=200)
  ip netns exec "$leaf" nft flush set ip t55 seen
  for r in 1 0; do
    local extra=()
    [ $r = 0 ] && extra=(--ready-file /tmp/$tag.ready)
    fab exec h$((r + 1)) -- timeout 120 "${env[@]}" "$BENCH" --rank $r --world 2 --bootstrap "$boot" \
      --transport verbs -d rxe0 --verb send -b 256K -e 256K -w 2 -c 1 --seg 64K --duration 60 --stop-file /tmp/$tag.stop \
      --stall-timeout 15 --retry-cnt 7 --qp-timeout 14 "${extra[@]}" > "$TMP/$tag.rank$r.out" 2>&1 &
    pids+=($!)
  done
  for _ in $(seq 300); do fab exec h1 -- test -e /tmp/$tag.ready 2>/dev/null && break; sleep 0.2; done
  sleep 3
  local shadows ports own=
  shadows=$(sed -n 's/.*UDP source ports \([0-9,]*\)).*/\1/p' "$TMP/$tag.rank0.out" | tr ',' ' ')
  ports=$(seen_sports t55 "$leaf")
  for p in $ports; do [[ " $shadows " == *" $p "* ]] || own+="$p "; done
  echo "$tag: h1's RoCE source ports $(echo $ports); shadows: ${shadows:-none}; the job's own QP: $own"
  [ "$(echo $own | wc -w)" = 1 ] || fail "$tag: cannot tell the job's own QP's source port"
  note "$tag: dropping every packet from h1's port $own until the job ends"
  ip netns exec "$leaf" nft add rule ip t55 cut ip saddr "$a1" udp sport "$own" drop || fail "nft drop"
  if [ "$mode" = with ]; then  # what an operator sees of the live job once it moved
    sleep 6
    fab exec h1 -- "$B/bin/shuntctl" paths --interval 1100 > "$TMP/$tag.paths" 2>&1
    fab exec h1 -- "$B/bin/shuntctl" paths --json --interval 1100 > "$TMP/$tag.paths.json" 2>&1
    # the agent's metrics textfile of the live job (the last one, written
    # after the job destroyed its QPs, has no bundle left to show); read
    # through an open file, as cp refuses a file renamed over while it copies
    fab exec h1 -- sh -c "cat /tmp/$tag.prom > /tmp/$tag.live.prom"
    # the job runs until this is done (the fab exec calls take seconds on a busy host)
    fab exec h1 -- touch /tmp/$tag.stop
  fi
  local rc=0
  for p in "${pids[@]}"; do wait "$p" || rc=$?; done
  ip netns exec "$leaf" nft flush chain ip t55 cut
  echo $rc > "$TMP/$tag.rc"
}

run base without
echo "without libshunt: exit $(cat $TMP/base.rc)"
grep -h "error" "$TMP"/base.rank*.out | head -3
[ "$(cat $TMP/base.rc)" != 0 ] || fail "the job without libshunt survived: the fault missed it"
grep -qh "no progress" "$TMP"/base.rank*.out || { cat "$TMP/base.rank0.out"; fail "without libshunt the job did not hang"; }

run stall with
for r in 0 1; do
  out=$TMP/stall.rank$r.out
  grep -E "stalled|moved|no path" "$out" | sed "s/^/  rank $r: /" | head -8
  ! grep -q "shunt-bench: rank $r: error" "$out" || { cat "$out"; fail "rank $r saw an error"; }
done
out=$TMP/stall.rank0.out
grep -qE "^# Errors seen +: 0$" "$out" || { cat "$out"; fail "errors seen"; }
rows=$(awk '$1 ~ /^[0-9]+$/ && NF >= 13' "$out" | wc -l)
awk '$1 ~ /^[0-9]+$/ && NF >= 13 && $9 != 0 { bad = 1 } END { exit bad }' "$out" && [ "$rows" -ge 1 ] ||
  { cat "$out"; fail "#wrong is not 0 (or no result)"; }
[ "$(cat $TMP/stall.rc)" = 0 ] || { cat "$TMP/stall.rank0.out" "$TMP/stall.rank1.out"; fail "the job failed with libshunt"; }
grep -qh "stalled: nothing completed while the device retransmitted" "$TMP"/stall.rank*.out ||
  { grep -h "failed (" "$TMP"/stall.rank*.out; fail "no path was failed for a stall"; }
fab exec h1 -- cat /tmp/stall-stats.json > "$TMP/s0.json"
fab exec h2 -- cat /tmp/stall-stats.json > "$TMP/s1.json"
b() { jget "$TMP/s$1.json" "[q['bundle'] for q in d['verbs']['qps'] if q.get('bundle')][0]['$2']"; }
echo "h1 sent $(b 0 messages_sent), h2 received $(b 1 messages_received);" \
  "h2 sent $(b 1 messages_sent), h1 received $(b 0 messages_received); moves $(b 0 moves)/$(b 1 moves)"
[ "$(b 0 messages_sent)" = "$(b 1 messages_received)" ] || fail "h1's messages not all received once"
[ "$(b 1 messages_sent)" = "$(b 0 messages_received)" ] || fail "h2's messages not all received once"
[ "$(b 0 moves)" -ge 1 ] || fail "the application's QP never moved"
# shuntctl paths showed the live job's bundle: its own QP's path down, a shadow carrying.
cat "$TMP/stall.paths"
python3 - "$TMP/stall.paths.json" <<'PY' || fail "shuntctl paths does not show the move"
import json, sys
p = json.load(open(sys.argv[1]))["bundle_paths"]
prim = [x for x in p if x["path"] == "primary"]
carrier = [x for x in p if x["carrier"]]
sys.exit(0 if prim and not prim[0]["up"] and prim[0]["fails"] >= 1 and carrier and carrier[0]["path"] != "primary"
         and carrier[0]["up"] else 1)
PY
# The agent's metrics name the failed path and the one that carries the work now.
fab exec h1 -- cat /tmp/stall.live.prom > "$TMP/stall.prom" || fail "no metrics textfile"
grep -E '^shunt_bundle_path_(failures_total|carrier)\{' "$TMP/stall.prom" | grep -v ' 0$'
grep -qE '^shunt_bundle_path_failures_total\{.*path="primary".*\} [1-9]' "$TMP/stall.prom" ||
  fail "the metrics do not show the application's QP's path failing"
grep -qE '^shunt_bundle_path_carrier\{.*path="[0-9]+".*\} 1$' "$TMP/stall.prom" ||
  fail "the metrics do not show a shadow carrying the two-sided work"
if command -v promtool >/dev/null; then
  promtool check metrics < "$TMP/stall.prom" || fail "promtool rejects the metrics"
fi
# The last textfile, written after the job destroyed its QPs: a destroyed
# QP's bundle stays in the counters (one that fell would read as a reset).
fab exec h1 -- cat /tmp/stall.prom > "$TMP/stall.end.prom" || fail "no final metrics textfile"
fails() { awk '/^shunt_bundle_path_failures_total\{.*path="primary"/ { s += $NF } END { print s + 0 }' "$1"; }
echo "failures of the application's QP's path: $(fails "$TMP/stall.prom") live, $(fails "$TMP/stall.end.prom") after the job"
[ "$(fails "$TMP/stall.end.prom")" -ge "$(fails "$TMP/stall.prom")" ] ||
  fail "the failure counter fell once the job destroyed its QPs"
echo "ok: a QP that retries forever through a dead route moved on a stall, every message exactly once"
