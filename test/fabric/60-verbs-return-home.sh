#!/usr/bin/env bash
# timeout: 300
# Shadows go back to their spine once it heals, on soft-RoCE guests: 2
# hosts on their own leaves, 2 spines, one split job with 8 shadows per QP
# (placed 4:4 by path discovery, -c 1). The link from h1's leaf to s1 is
# black-holed for 10 s: every shadow that fails is renewed until its port
# works, so all end up crossing s2. After the link heals, the shadows away
# from the router discovery placed them on are renewed onto it (planned:
# no failure counted), and both spines carry h1's data again: each at least
# a tenth of it over 5 s from 20 s after the heal (without the homecoming:
# s1 ~0.2%; with it 24-47% at 12 s, the spines' ICMP rate limit letting
# about one shadow a second come home).
# Checked too: #wrong 0, no error seen by the application, at least one
# homecoming. A run that fails prints a timeline: the faults and each
# side's events (SHUNT_EVENT_LOG), in time order.
. "$(dirname "$0")/lib.sh"
need_guests
BENCH=$B/bin/shunt-bench
[ -f "$LIB" ] || fail "no $LIB (make)"
up --hosts 2 --rails 1 --spines 2
a1=$(fab addr h1 r0)
KEY=home-$$
pids=()
for r in 1 0; do
  fab exec "h$((r + 1))" -- timeout 150 env LD_PRELOAD="$LIB" SHUNT_MODE=active SHUNT_SPREAD=split \
    SHUNT_SPLIT_MIN_BYTES=65536 SHUNT_JOB_KEY="$KEY" SHUNT_PATHS_PER_RAIL=8 SHUNT_LOG_LEVEL=info \
    SHUNT_STATS_FILE=/tmp/home$r.json SHUNT_EVENT_LOG=/tmp/home$r.events "$BENCH" --rank $r --world 2 --bootstrap "$a1:29960" \
    --transport verbs -d rxe0 --verb write_imm -b 256K -e 256K --duration 50 -w 2 -c 1 --seg 256K \
    > "$TMP/home$r.out" 2>&1 &
  pids+=($!)
done
# timeline: on a failure, the faults and both sides' events (shuntctl
# events), in time order (the guests' clocks are set from the host's).
now_iso() { date -u +%Y-%m-%dT%H:%M:%S.%NZ; }
timeline() {
  echo "--- timeline"
  {
    echo "$t_bh  test: l1r0-s1 black-holed"
    echo "$t_heal  test: l1r0-s1 back"
    for h in h1 h2; do
      fab exec $h -- "$B/bin/shuntctl" events --file /tmp/home$((${h#h} - 1)).events 2>/dev/null |
        grep -v '^\S*  config ' | sed "s/^\(\S*\)  /\1  $h /"
    done
  } | sort | tail -n 30 | cut -c1-180
}
sleep 10
snap a0; sleep 4; snap a1
echo "before: s1 $(delta a0 a1 l1r0-s1 up_bytes) B, s2 $(delta a0 a1 l1r0-s2 up_bytes) B (4 s)"
fab fault blackhole l1r0-s1 >/dev/null || fail "blackhole"
t_bh=$(now_iso)
note "l1r0-s1 black-holed"
sleep 10
fab fault blackhole --off l1r0-s1 >/dev/null || fail "unblackhole"
t_heal=$(now_iso)
note "l1r0-s1 back"
sleep 20
snap b0; sleep 5; snap b1
for p in "${pids[@]}"; do wait "$p" || {
  grep -ah -v '^#' "$TMP/home0.out" "$TMP/home1.out" | grep -v 'shunt info: peer channel\|host agent\|metrics:'
  grep -ah '^# Errors seen' "$TMP/home0.out" "$TMP/home1.out"
  timeline
  fail "a rank failed"
}; done
s1=$(delta b0 b1 l1r0-s1 up_bytes) s2=$(delta b0 b1 l1r0-s2 up_bytes)
echo "after:  s1 $s1 B, s2 $s2 B (5 s, from 20 s after the link came back)"
grep -h 'renewed on\|failed (' "$TMP/home0.out" | head -20
grep -h 'back to the router\|home router' "$TMP/home0.out" "$TMP/home1.out" || true
grep -v '^#' "$TMP/home0.out" | awk '$1 ~ /^[0-9]+$/ && NF == 13 { n++; if ($9 != 0) bad = 1 } END { exit bad || !n }' ||
  { cat "$TMP/home0.out"; fail "#wrong not 0"; }
grep -q '^# Errors seen *: 0' "$TMP/home0.out" || fail "errors seen: $(grep 'Errors seen' "$TMP/home0.out")"
read -r home fails paths < <(fab exec h1 -- cat /tmp/home0.json | python3 -c '
import json, sys
for q in json.load(sys.stdin)["verbs"]["qps"]:
    b = q.get("bundle")
    if b and b["paths"]:
        for p in b["paths"]:
            print("  path port %d router %s home %s fails %d" % (p["udp_sport"], p["router"] or "?", p["home"] or "?", p["fails"]),
                  file=sys.stderr)
        print(b["homecomings"], sum(p["fails"] for p in b["paths"]), len(b["paths"]))
        break')
echo "h1: $home homecomings, $fails failures over $paths paths"
[ "${home:-0}" -ge 1 ] || fail "no shadow went back to its router"
[ $((s1 * 10)) -ge $((s1 + s2)) ] && [ $((s2 * 10)) -ge $((s1 + s2)) ] ||
  fail "after the link healed h1's data stayed on one spine (s1 $s1 B, s2 $s2 B)"
echo ok
