#!/usr/bin/env bash
# timeout: 90
# Failures are loud: a peer that dies mid-run makes the survivor print one
# clear error line with the status and exit 2, counting the error in the
# footer and the JSON; a stalled peer is reported after --stall-timeout;
# bad usage and a missing RDMA device are refused with a non-zero exit.
set -u
. "$(dirname "$0")/bench-lib.sh"

# 1. peer killed mid-run (a process this test started, by PID)
port=$(free_port)
"$BENCH" --rank 1 --world 2 --bootstrap 127.0.0.1:$port -b 1M -e 1M -n 1000000 \
  >"$WORK/r1.log" 2>&1 &
victim=$!; PIDS+=($victim)
( sleep 2; kill -9 $victim ) &
PIDS+=($!)
timeout 60 "$BENCH" --rank 0 --world 2 --bootstrap 127.0.0.1:$port -b 1M -e 1M -n 1000000 \
  --timeline 250 -q -J "$WORK/dead.json" >"$WORK/dead.out" 2>"$WORK/dead.err"
rc=$?
cat "$WORK/dead.out" "$WORK/dead.err"
[ $rc = 2 ] || fail "survivor exited $rc, want 2"
grep -Eq '^shunt-bench: rank 0: error: tcp (recv from|send to) rank 1 failed: .*(Connection reset|closed by peer|Broken pipe)' \
  "$WORK/dead.err" || fail "no clear error line naming the peer and the status"
grep -q '^# Errors seen *: [1-9]' "$WORK/dead.out" || fail "footer does not count the error"
python3 - "$WORK/dead.json" <<'PY' || fail "JSON of a failed run"
import json, sys
j = json.load(open(sys.argv[1]))
assert j["errors"] >= 1 and "rank 1" in j["error"], j
assert len(j["timeline"]["samples"]) >= 4  # what was measured before the failure is kept
PY

# 2. a peer that stops answering (SIGSTOP) is a stall, not a hang
port=$(free_port)
"$BENCH" --rank 1 --world 2 --bootstrap 127.0.0.1:$port -b 4M -e 4M --duration 20 >/dev/null 2>&1 &
frozen=$!; PIDS+=($frozen)
( sleep 1.5; kill -STOP $frozen ) &
PIDS+=($!)
start=$SECONDS
timeout 60 "$BENCH" --rank 0 --world 2 --bootstrap 127.0.0.1:$port -b 4M -e 4M --duration 20 \
  --stall-timeout 2 >"$WORK/stall.out" 2>"$WORK/stall.err"
rc=$?
kill -CONT $frozen 2>/dev/null
cat "$WORK/stall.err"
[ $rc = 2 ] || fail "stalled run exited $rc, want 2"
grep -q 'no progress for 2 s\|nothing received for 2 s' "$WORK/stall.err" || fail "stall not reported"
[ $((SECONDS - start)) -lt 15 ] || fail "stall detection took too long"

# 3. usage errors and a missing device
"$BENCH" --transport carrier-pigeon >/dev/null 2>&1 && fail "bad --transport accepted"
"$BENCH" -b 1Q >/dev/null 2>&1 && fail "bad size accepted"
"$BENCH" --world 2 >/dev/null 2>&1; [ $? = 2 ] || fail "--world 2 without --bootstrap must exit 2"
if [ ! -d /sys/class/infiniband ] || [ -z "$(ls /sys/class/infiniband 2>/dev/null)" ]; then
  "$BENCH" --transport verbs -b 4K -e 4K 2>"$WORK/verbs.err"; rc=$?
  cat "$WORK/verbs.err"
  [ $rc = 2 ] && grep -q 'error: verbs: no RDMA devices' "$WORK/verbs.err" || fail "missing device not reported"
fi
echo ok
