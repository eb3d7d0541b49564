#!/usr/bin/env bash
# timeout: 90
# -c 1 can fail: with the hidden --corrupt flag rank 0 flips one byte of
# what it sends in every timed iteration; the receivers must count exactly
# that many wrong bytes (alltoall, sendrecv) or elements (allreduce), print
# FAILED and exit 1.
set -u
. "$(dirname "$0")/bench-lib.sh"

iters=4
for pat in alltoall sendrecv allreduce; do
  out=$WORK/$pat.out
  run_ranks 3 "$out" --transport tcp -p $pat -b 96K -e 96K -n $iters -w 1 -c 1 --corrupt -J "$WORK/$pat.json"
  rc=$?
  cat "$out"
  [ $rc = 1 ] || fail "$pat: corrupted run exited $rc, want 1"
  grep -q '^# Out of bounds values : [1-9][0-9]* FAILED' "$out" || fail "$pat: no FAILED footer"
  # one flipped byte per iteration reaches one rank (allreduce: every rank
  # gets the corrupted sum of that element)
  want=$iters; [ $pat = allreduce ] && want=$((iters * 3))
  expect_wrong "$out" $want
  python3 -c "import json,sys; j=json.load(open(sys.argv[1])); assert j['wrong_total']==$want, j['wrong_total']" \
    "$WORK/$pat.json" || fail "$pat: JSON wrong_total"
  # and the same run without the flag is clean
  run_ranks 3 "$out" --transport tcp -p $pat -b 96K -e 96K -n $iters -w 1 -c 1 || fail "$pat: clean run failed"
  expect_wrong "$out" 0
done
echo ok
