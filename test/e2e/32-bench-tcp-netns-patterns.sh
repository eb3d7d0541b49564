#!/usr/bin/env bash
# timeout: 120
# Ranks on two "hosts" (network namespaces joined by a veth pair, created
# and deleted here): alltoall, ring allreduce and sendrecv at 4 ranks, every
# byte checked; allreduce busbw = algbw * 2(n-1)/n, sendrecv busbw = algbw.
set -u
. "$(dirname "$0")/bench-lib.sh"
veth_pair sbt 10.213.0
netns_of() { [ $(($1 % 2)) = 0 ] && echo $A || echo $B; }  # ranks alternate hosts
BOOT_HOST=10.213.0.1

for pat in alltoall allreduce sendrecv; do
  out=$WORK/$pat.out
  run_ranks 4 "$out" --transport tcp -p $pat -b 4K -e 1M -f 16 -n 4 -w 1 -c 1 ||
    { cat "$out" "$WORK"/*.log "$WORK"/rank0.err; fail "$pat exited $?"; }
  cat "$out"
  expect_wrong "$out" 0
  grep -q 'tcp 10.213.0.2:' "$out" || fail "$pat: no rank listened in the second namespace"
  case $pat in
    alltoall) f=0.75 type=uint8 op=none ;;
    allreduce) f=1.5 type=float op=sum ;;
    sendrecv) f=1 type=uint8 op=none ;;
  esac
  rows "$out" | awk -v f=$f -v t=$type -v op=$op '{ d = $8 - $7 * f; if (d < 0) d = -d;
      if ($3 != t || $4 != op || d > 0.0015) { print "bad: " $0; bad = 1 } } END { exit bad }' ||
    fail "$pat: type/redop/busbw"
done
echo ok
