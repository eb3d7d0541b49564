#!/usr/bin/env bash
# timeout: 90
# The timeline shows a dip and the recovery: two ranks in two namespaces
# (created and deleted here) run tcp alltoall for 8 s while the veth
# between them is down for 2 s; TCP rides it out, the run succeeds with
# #wrong 0, and the timeline has throughput before, zeros during, and
# throughput again after the outage, which the marks bracket.
set -u
. "$(dirname "$0")/bench-lib.sh"
veth_pair sbd 10.214.0
netns_of() { [ "$1" = 0 ] && echo $A || echo $B; }
BOOT_HOST=10.214.0.1

marks=$WORK/marks
: >"$marks"
( sleep 3; echo "@$(date +%s.%N):down" >>"$marks"; ip -n $B link set v1 down
  sleep 2; echo "@$(date +%s.%N):up" >>"$marks"; ip -n $B link set v1 up ) &
PIDS+=($!)
out=$WORK/dip.out
run_ranks 2 "$out" --transport tcp -b 1M -e 1M --duration 8 --timeline 100 -q -c 1 --stall-timeout 20 \
  --marks-file "$marks" -J "$WORK/dip.json" --plot "$WORK/dip.png" ||
  { cat "$out" "$WORK"/*.log "$WORK"/rank0.err; fail "run across the outage exited $?"; }
cat "$out"
expect_wrong "$out" 0
python3 - "$WORK/dip.json" <<'PY' || fail "timeline does not show the dip and the recovery"
import json, sys
j = json.load(open(sys.argv[1]))
s = [(x[1], x[3]) for x in j["timeline"]["samples"]]
m = {x["label"]: x["t"] for x in j["marks"]}
down, up = m["down"], m["up"]
before = [g for t, g in s if 0.5 < t <= down]
during = [g for t, g in s if down + 0.3 < t <= up]
after = [g for t, g in s if up + 1.5 < t]
print(f"down at {down:.2f}s, up at {up:.2f}s; GB/s before {sum(before)/len(before):.3f}, "
      f"during {max(during):.3f} max, after {sum(after)/len(after):.3f}")
assert min(before) > 0, "throughput before the outage"
assert max(during) == 0, "no throughput while the link is down"
assert sum(after) / len(after) > 0.2 * sum(before) / len(before), "throughput back after the outage"
PY
[ -s "$WORK/dip.png" ] || fail "no plot"
echo ok
