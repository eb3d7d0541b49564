#!/usr/bin/env bash
# Two hosts (network namespaces joined by a veth pair) probe each other;
# taking the link down and up again shows in the event log (path_down,
# then path_up, with both clocks), in shuntctl paths/events/top (plain and
# --json) and in the metrics (shunt_path_up, delays, clock offset).
# timeout: 90
. "$(dirname "$0")/../lib.sh"
[ "$(id -u)" = 0 ] || skip "needs root (network namespaces)"
command -v ip >/dev/null || skip "needs iproute2"
NA=tma$$ NB=tmb$$
veth_pair $NA $NB

mport=$(free_port)
common="SHUNT_JOB_KEY=path-events-$$ SHUNT_MODE=observe SHUNT_REPORT_INTERVAL_MS=100 SHUNT_PROBE_INTERVAL_MS=20 SHUNT_PATH_DEAD_MS=200 SHUNT_METRICS_ADDR=127.0.0.1:$mport SHUNT_CLOCK_SHM=/shunt-test-$$-%h"
mkdir -p "$TMP/ra" "$TMP/rb"
ip netns exec $NA env $common SHUNT_RUN_DIR=$TMP/ra SHUNT_EVENT_LOG=$TMP/a-%p.log SHUNT_PROBE_NAME=a \
  SHUNT_PROBE_ADDRS=10.99.0.1 SHUNT_PEERS=b=10.99.0.2 LD_PRELOAD=$LIB "$B/test/hold_socket" 60000 & pa=$!
ip netns exec $NB env $common SHUNT_RUN_DIR=$TMP/rb SHUNT_EVENT_LOG=$TMP/b-%p.log SHUNT_PROBE_NAME=b \
  SHUNT_PROBE_ADDRS=10.99.0.2 SHUNT_PEERS=a=10.99.0.1 LD_PRELOAD=$LIB "$B/test/hold_socket" 60000 & pb=$!
at_exit "kill $pa $pb 2>/dev/null; wait $pa $pb 2>/dev/null"
log=$TMP/a-$pa.log
ctl() { SHUNT_RUN_DIR=$TMP/ra "$B/bin/shuntctl" "$@"; }
# wait_event TYPE COUNT: until the log has COUNT events of TYPE (5 s)
wait_event() {
  for i in $(seq 100); do
    local n; n=$(grep -c "\"event\":\"$1\"" "$log" 2>/dev/null)
    [ "${n:-0}" -ge "$2" ] && return 0
    sleep 0.05
  done
  fail "no $2 $1 event in $log: $(cat "$log" 2>/dev/null)"
}
wait_event path_up 1
ok "path up after start"
# Let the clock model form (delays need it), then check the metrics.
for i in $(seq 60); do
  ip netns exec $NA python3 -c 'import sys, urllib.request; sys.stdout.write(urllib.request.urlopen(sys.argv[1], timeout=5).read().decode())' \
    "http://127.0.0.1:$mport/metrics" > "$TMP/m" 2>/dev/null
  grep -q '^shunt_path_rtt_seconds{' "$TMP/m" && grep -q '^shunt_peer_clock_offset_seconds{peer="b"}' "$TMP/m" && break
  sleep 0.25
done
grep -q '^shunt_path_up{peer="b",rail="0",path="10.99.0.1->10.99.0.2"} 1$' "$TMP/m" || fail "shunt_path_up not 1: $(grep path_up "$TMP/m")"
grep -q '^shunt_path_one_way_delay_seconds_count{peer="b",rail="0",path="10.99.0.1->10.99.0.2",direction="tx"} [1-9]' "$TMP/m" ||
  fail "no one-way delay: $(grep -E 'delay|clock' "$TMP/m")"
grep -q '^shunt_path_rtt_seconds{' "$TMP/m" || fail "no path RTT"
grep -q '^shunt_peer_clock_bound_seconds{peer="b"}' "$TMP/m" || fail "no clock bound"
if command -v promtool >/dev/null; then promtool check metrics < "$TMP/m" || fail "promtool rejects the scrape"; fi
ok "path metrics: up, one-way delay, RTT, clock offset and bound"

ctl paths --interval 100 | tee "$TMP/p1"
grep -Eq '^b +0 +10.99.0.1->10.99.0.2 +up ' "$TMP/p1" || fail "shuntctl paths: path not up"
ctl paths --json --interval 100 > "$TMP/p1.json" || fail "shuntctl paths --json"
expect_eq "$(jget "$TMP/p1.json" '[(p["peer"], p["rail"], p["alive"]) for p in d["paths"]]')" "[('b', 0, True)]" "paths --json"

ip -n $NA link set va down
t_down=$(date +%s%N)
wait_event path_down 1
ok "path_down after the link went down ($(( ($(date +%s%N) - t_down) / 1000000 )) ms)"
ctl paths --json --interval 100 > "$TMP/p2.json"
expect_eq "$(jget "$TMP/p2.json" 'd["paths"][0]["alive"]')" False "paths --json shows it down"
ctl paths --interval 100 | grep -Eq ' DOWN ' || fail "plain paths does not show DOWN"
ip -n $NA link set va up
wait_event path_up 2
ok "path_up after the link came back"

python3 - "$log" <<'PY' || fail "event lines"
import json, sys
evs = [json.loads(l) for l in open(sys.argv[1])]
kinds = [e["event"] for e in evs]
print(kinds)
assert kinds[0] == "config" and evs[0]["set"]["SHUNT_PROBE_ADDRS"] == "10.99.0.1", evs[0]
paths = [e for e in evs if e["event"].startswith("path_")]
assert [e["event"] for e in paths][-3:] == ["path_up", "path_down", "path_up"], paths
for e in evs:
    assert e["wall_ns"] > 1.5e18 and e["mono_ns"] > 0 and e["time"].endswith("Z") and e["host"]
for e in paths:
    assert e["peer"] == "b" and e["rail"] == 0 and e["path"] == "10.99.0.1->10.99.0.2", e
mono = [e["mono_ns"] for e in evs]
assert mono == sorted(mono), "monotonic time goes backwards"
PY
ok "events: config first, then path_up, path_down, path_up with both clocks"

ctl events > "$TMP/e.txt" || fail "shuntctl events"
grep -q 'path_down .*peer=b' "$TMP/e.txt" || fail "plain events lack path_down: $(cat "$TMP/e.txt")"
ctl events --json > "$TMP/e.json" || fail "shuntctl events --json"
expect_eq "$(jget "$TMP/e.json" '[e["event"] for e in d if e["event"].startswith("path_")][-2:]')" "['path_down', 'path_up']" "events --json"
# --follow prints an event that happens after it started.
# (The binary itself in the background, not the ctl function: killing a
# function's subshell would leave the follower running.)
SHUNT_RUN_DIR=$TMP/ra "$B/bin/shuntctl" events --follow --json > "$TMP/follow" & fpid=$!
at_exit "kill $fpid 2>/dev/null"
sleep 0.5
ip -n $NA link set va down
for i in $(seq 100); do [ "$(grep -c path_down "$TMP/follow")" -ge 2 ] && break; sleep 0.05; done
kill $fpid; wait $fpid 2>/dev/null
[ "$(grep -c path_down "$TMP/follow")" -ge 2 ] || fail "events --follow missed the new path_down"
python3 -c 'import json,sys; [json.loads(l) for l in open(sys.argv[1])]' "$TMP/follow" || fail "--follow --json lines do not parse"
ok "events --follow"

ctl top --iterations 2 --interval 200 > "$TMP/top" || fail "shuntctl top"
grep -q "^shunt top: agent pid $pa" "$TMP/top" || fail "top header: $(head -3 "$TMP/top")"
grep -Eq '^b +0 +10.99.0.1->10.99.0.2 +DOWN' "$TMP/top" || fail "top lacks the path"
ctl top --json -n 2 --interval 100 > "$TMP/top.json"
expect_eq "$(python3 -c 'import json,sys; print(len([json.loads(l) for l in open(sys.argv[1])]))' "$TMP/top.json")" 2 "top --json frames"
# Live in a terminal: it redraws in place until interrupted.
if command -v tmux >/dev/null; then
  sock=$TMP/tmux
  tmux -S "$sock" new-session -d -x 160 -y 40 "SHUNT_RUN_DIR=$TMP/ra $B/bin/shuntctl top --interval 200"
  at_exit "tmux -S $sock kill-server 2>/dev/null"
  sleep 1
  tmux -S "$sock" capture-pane -p > "$TMP/pane"
  grep -q "shunt top: agent pid $pa" "$TMP/pane" || fail "top in tmux: $(cat "$TMP/pane")"
  [ "$(grep -c 'shunt top:' "$TMP/pane")" = 1 ] || fail "top does not redraw in place"
  tmux -S "$sock" send-keys C-c
  sleep 0.3
  ok "top redraws in a terminal"
fi
