#!/usr/bin/env bash
# timeout: 300
# A pinned job steered off a congested spine: SHUNT_SPREAD=pin with
# SHUNT_STEER=queue keeps all of an application QP's work on one path (the
# carrier: at first the application's own QP) and moves it whole, over the
# failover's carrier move but counting no failure, when the host agents'
# probes find the carrier's forward queue congested while another path's is
# clear. Once the job runs, h1's leaf uplink to the spine its carrier
# crosses is limited to a tenth of the rate it carries (1 s of tbf queue;
# soft-RoCE's window-limited flow queues about 1/rate there: at a third
# 14-38 ms, within reach of the 14-25 ms a stalled guest shows on every
# path for a second).
# Checked:
# - no move before the fault (nothing queues then but a stalled guest,
#   on every path), a steer-carrier event
#   within 25 s of it, naming the old carrier congested and the new path
#   clear, and no failover counted;
# - within 25 s of it h1's traffic crosses the other spine (counters over
#   3 s);
# - the data is whole (#wrong 0) and both ranks exit 0.
. "$(dirname "$0")/lib.sh"
need_guests
BENCH=$B/bin/shunt-bench
command -v nft >/dev/null || skip "no nft"
up --hosts 2 --rails 1 --spines 2 --ecmp-hash sport
KEY=steer-carrier-$$
a1=$(fab addr h1 r0); a2=$(fab addr h2 r0)
sport_watch

probe_agent h1 "$a1" "$a2"
probe_agent h2 "$a2" "$a1"
sleep 6

rank() {  # RANK HOST
  fab exec "$2" -- timeout 150 env LD_PRELOAD="$LIB" SHUNT_MODE=active SHUNT_SPREAD=pin SHUNT_STEER=queue \
    SHUNT_JOB_KEY="$KEY" SHUNT_PATHS_PER_RAIL=4 SHUNT_PATH_DEAD_MS=8000 SHUNT_STALL_MS=8000 SHUNT_LOG_LEVEL=info \
    SHUNT_STATS_FILE="/tmp/sc$1.json" SHUNT_EVENT_LOG="/tmp/evc$1.jsonl" \
    "$BENCH" --rank "$1" --world 2 --bootstrap "$a1:29917" --transport verbs -d rxe0 --verb write_imm \
    -b 256K -e 256K --duration 90 --stop-file /tmp/steer-carrier.stop -w 8 -c 1 --seg 256K --qp-timeout 18 \
    --stall-timeout 60 > "$TMP/rank$1.out" 2>&1
}
rank 1 h2 &
r1=$!
rank 0 h1 &
r0=$!
# The carrier's spine: the one the application QP's port was seen on.
slow_spine=
for _ in $(seq 1 60); do
  sleep 0.5
  fab exec h1 -- "$B/bin/shuntctl" paths --json > "$TMP/early.json" 2>/dev/null || continue
  slow_spine=$(python3 - "$TMP/early.json" "$(sport_seen s1 roce)" "$(sport_seen s2 roce)" "$a1" <<'PY'
import json, sys
ps = json.load(open(sys.argv[1])).get("bundle_paths", [])
prim = [p["udp_sport"] for p in ps if p["path"] == "primary" and p.get("udp_sport")]
seen = [{int(x.split(":")[1]) for x in arg.split() if x.startswith(sys.argv[4] + ":")} for arg in sys.argv[2:4]]
if len(ps) == 5 and prim and (prim[0] in seen[0]) != (prim[0] in seen[1]):
    print("s1" if prim[0] in seen[0] else "s2")
PY
)
  [ -n "$slow_spine" ] && break
done
[ -n "$slow_spine" ] || fail "h1's application QP was not seen on one spine"
other=s1; [ "$slow_spine" = s1 ] && other=s2
slow_link "l1r0-$slow_spine" 10
note "h1's uplink to $slow_spine (its carrier's) limited to $limit Mbit/s (it carried $sent bytes in $(python3 -c "print(round($t1 - $t0, 1))") s)"
# Until h1's traffic crosses the other spine (3 s windows, 25 s at most):
# a first move may clear the other direction only, and the next one comes
# after the dwell and a new hold.
left=
end=$((SECONDS + 25))
while [ $SECONDS -lt $end ]; do
  snap m0; sleep 3; snap m1
  on_slow=$(delta m0 m1 "l1r0-$slow_spine" up_bytes) && on_other=$(delta m0 m1 "l1r0-$other" up_bytes) || fail "counters"
  [ "$on_other" -gt $((2 * on_slow)) ] && { left=1; break; }
done
note "last 3 s: h1's uplinks carried $on_slow bytes to $slow_spine, $on_other to $other${left:+ (left $((SECONDS - end + 25)) s after the fault)}"
fab exec h1 -- touch /tmp/steer-carrier.stop
wait $r0 || { cat "$TMP/rank0.out"; fail "rank 0 failed"; }
wait $r1 || { cat "$TMP/rank1.out"; fail "rank 1 failed"; }
grep -v '^#' "$TMP/rank0.out" | awk '$1 ~ /^[0-9]+$/ && NF == 13 { n++; if ($9 != 0) bad = 1 } END { exit bad || !n }' ||
  { cat "$TMP/rank0.out"; fail "#wrong not 0"; }
for r in 0 1; do
  h=h$((r + 1))
  fab exec $h -- cat /tmp/sc$r.json > "$TMP/sc$r.json"
  fab exec $h -- cat /tmp/evc$r.jsonl > "$TMP/evc$r.jsonl"
done
python3 - "$TMP" "$fault_ns" "$on_slow" "$on_other" <<'PY' || fail "carrier steering"
import json, sys
tmp, fault, on_slow, on_other = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
for r in (0, 1):
    b = next(q["bundle"] for q in json.load(open(f"{tmp}/sc{r}.json"))["verbs"]["qps"] if q.get("bundle") and q["bundle"]["paths"])
    print(f"rank {r}: steer {b['steer']}, carrier {b['carrier']}, carrier steers {b['carrier_steers']}, failovers {b['failovers']}, moves {b['moves']}")
    print(f"  at the end: {json.dumps(b.get('carrier_steering'))}")
    if b["steer"] != "queue-carrier":
        sys.exit(f"rank {r}: steering mode {b['steer']}")
    if b["failovers"]:
        sys.exit(f"rank {r}: a steering move counted as a failover")
ev = [json.loads(l) for r in (0, 1) for l in open(f"{tmp}/evc{r}.jsonl")]
moves = [e for e in ev if e["event"] == "steer-carrier"]
if not moves:
    sys.exit("no steer-carrier event: the carrier stayed on the congested spine")
dec = [e for e in moves if e.get("deciding")]
for e in dec:
    print(f"  {(e['mono_ns'] - fault) / 1e9:.1f} s after the fault: {e['from']} -> {e['to']}, queue there "
          f"{e['from_queue_us'] / 1000:.1f} ms (own {e['from_own']}, peer {e['from_peer']}), at the target "
          f"{e['to_queue_us'] / 1000:.1f} ms, hold window {e['hold_window_ms']} ms")
if any(e["mono_ns"] < fault for e in dec):
    sys.exit("the carrier moved before the fault, on an unloaded fabric")
if not dec or (dec[0]["mono_ns"] - fault) / 1e9 > 25:
    sys.exit("no deciding side's move within 25 s of the fault")
if dec[0]["from_own"] != 1 and dec[0]["from_peer"] != 1:
    sys.exit("the first move names no congested queue on the carrier")
if on_other <= 2 * on_slow:
    sys.exit(f"25 s after the fault h1's traffic had not left the slow spine ({on_slow} against {on_other} bytes)")
PY
echo "ok: the carrier left the congested spine for a clear path, no failure counted, data whole"
