#!/usr/bin/env bash
# timeout: 90
# --stop-file: a run of --duration 40 ends once rank 0 sees the file
# (created here 2 s in), every rank with the same iteration count and the
# result row whole; without the file the duration still bounds the run;
# --stop-file without --duration is refused.
set -u
. "$(dirname "$0")/bench-lib.sh"

stop=$WORK/stop
( sleep 2; touch "$stop" ) &
PIDS+=($!)
start=$SECONDS
run_ranks 2 "$WORK/early.out" --transport tcp -b 64K -e 64K -c 1 --duration 40 --stop-file "$stop" ||
  { cat "$WORK/early.out" "$WORK/rank0.err"; fail "the stopped run exited $?"; }
took=$((SECONDS - start))
cat "$WORK/early.out"
for rc in "${RANK_RCS[@]}"; do [ "$rc" = 0 ] || fail "rank 1 exited $rc"; done
expect_wrong "$WORK/early.out" 0
[ "$took" -lt 30 ] || fail "the run took ${took}s: the stop file did not end it"
echo "stopped after ${took}s of a 40 s duration"

# the file is only looked at: a run without it lasts its duration
rm -f "$stop"
start=$SECONDS
run_ranks 2 "$WORK/full.out" --transport tcp -b 64K -e 64K -c 1 --duration 3 --stop-file "$stop" ||
  { cat "$WORK/full.out" "$WORK/rank0.err"; fail "the full run exited $?"; }
took=$((SECONDS - start))
[ "$took" -ge 3 ] || fail "a run of --duration 3 without its stop file ended after ${took}s"
expect_wrong "$WORK/full.out" 0

"$BENCH" --stop-file "$stop" >/dev/null 2>"$WORK/usage.err"; rc=$?
cat "$WORK/usage.err"
[ $rc = 64 ] && grep -q -- "--stop-file needs --duration" "$WORK/usage.err" || fail "--stop-file without --duration: exit $rc"
echo ok
