#!/usr/bin/env bash
# timeout: 420
# shunt-bench's verbs transport on real soft-RoCE: alltoall at 2 and 4
# ranks (one guest per rank), RDMA WRITE with immediate and SEND/RECV,
# ring allreduce, every received byte checked (#wrong 0); a corrupted run
# over verbs is detected; a link that goes down makes the run fail with
# IBV_WC_RETRY_EXC_ERR named on a rank's error line and exit 2.
. "$(dirname "$0")/lib.sh"
need_guests
BENCH=$ROOT/${BUILD:-build}/bin/shunt-bench
case $BENCH in /*) ;; *) BENCH=$ROOT/$BENCH ;; esac
[ -x "$BENCH" ] || skip "shunt-bench not built"
up --hosts 4 --rails 1 --spines 1 --hosts-per-leaf 2
BOOT=$(fab addr h1 r0) || fail "no address for h1 r0"
port=29600

# verbs_run N OUT ARGS...: rank r on guest h(r+1); rank 0's output to OUT
verbs_run() {
  local n=$1 out=$2; shift 2
  port=$((port + 1))
  local r pids=()
  for ((r = 1; r < n; r++)); do
    gexec h$((r + 1)) "$BENCH" --rank $r --world $n --bootstrap "$BOOT:$port" --transport verbs -d rxe0 \
      --stall-timeout 60 "$@" >"$TMP/rank$r.log" 2>&1 &
    pids+=($!)
  done
  gexec h1 "$BENCH" --rank 0 --world $n --bootstrap "$BOOT:$port" --transport verbs -d rxe0 \
    --stall-timeout 60 "$@" >"$out" 2>&1
  local rc=$? p
  for p in "${pids[@]}"; do wait $p || { [ $rc = 0 ] && rc=9; }; done
  cat "$out"
  return $rc
}

# all rows have #wrong $2
rows_wrong() {
  local n
  n=$(grep -v '^#' "$1" | awk '$1 ~ /^[0-9]+$/ && NF == 13' | wc -l)
  [ "$n" -gt 0 ] || return 1
  grep -v '^#' "$1" | awk -v w="$2" '$1 ~ /^[0-9]+$/ && NF == 13 && $9 != w { bad = 1 } END { exit bad }'
}

for n in 2 4; do
  for verb in write_imm send; do
    note "alltoall, $n ranks, $verb"
    verbs_run $n "$TMP/a2a-$n-$verb" --verb $verb -b 4K -e 1M -f 16 -n 3 -w 1 -c 1 --seg 256K ||
      fail "alltoall $n ranks $verb exited $?"
    rows_wrong "$TMP/a2a-$n-$verb" 0 || fail "alltoall $n ranks $verb: #wrong not 0"
    [ "$(grep -c "verbs rxe0 port 1 gid\[" "$TMP/a2a-$n-$verb")" = $n ] || fail "not every rank on rxe0"
  done
done

note "ring allreduce, 4 ranks"
verbs_run 4 "$TMP/ar" -p allreduce -b 64K -e 256K -f 4 -n 2 -w 1 -c 1 || fail "allreduce exited $?"
rows_wrong "$TMP/ar" 0 || fail "allreduce: #wrong not 0"

note "a corrupted run over verbs is caught"
verbs_run 2 "$TMP/bad" -b 64K -e 64K -n 3 -w 0 -c 1 --corrupt
rc=$?
[ $rc = 1 ] || { cat "$TMP/rank1.log"; fail "corrupted verbs run exited $rc, want 1"; }
rows_wrong "$TMP/bad" 3 || { cat "$TMP/rank1.log"; fail "corrupted verbs run: want #wrong 3"; }

note "link down under load: the error is reported, not hidden"
# retry count 6: rxe treats 7 as unlimited. -n rather than --duration, so
# the ranks only talk over the QPs while the link is down. The link goes
# down only once rank 0 is connected and running (its ready file, in the
# guest's own /tmp): on a slow machine a fixed delay could cut the link
# while the ranks still bootstrap over it.
gexec h1 rm -f /tmp/30-down.ready
(
  fab exec h1 -- timeout 120 sh -c 'until [ -f /tmp/30-down.ready ]; do sleep 0.2; done' || exit 1
  sleep 3
  date +%s > "$TMP/fault-at"
  fab fault link-down h1-r0
) &
faulter=$!
# The rank with a WR in flight when the link dies gets the retry error; the
# other may be left waiting for data with nothing outstanding, which its
# stall timeout (20 s) ends.
verbs_run 2 "$TMP/down" -b 64K -e 64K -n 1000000 -w 0 --retry-cnt 6 --qp-timeout 14 --stall-timeout 20 \
  --ready-file /tmp/30-down.ready
rc=$?
ended=$(date +%s)
wait $faulter || { cat "$TMP/rank1.log"; fail "rank 0 never became ready"; }
fab fault link-up h1-r0
[ $rc = 2 ] || { cat "$TMP/rank1.log"; fail "run over a dead link exited $rc, want 2"; }
grep -q '^shunt-bench: rank [01]: error: verbs: .* completion on QP [0-9]* (to rank [01]) failed: IBV_WC_RETRY_EXC_ERR (12' \
  "$TMP/down" "$TMP/rank1.log" || { cat "$TMP/rank1.log"; fail "no IBV_WC_RETRY_EXC_ERR error line"; }
grep -q '^# Errors seen *: [1-9]' "$TMP/down" || fail "errors not counted"
took=$((ended - $(cat "$TMP/fault-at")))
note "the failure surfaced $took s after the link went down"
[ $took -lt 60 ] || fail "the failure took $took s to surface"
echo ok
