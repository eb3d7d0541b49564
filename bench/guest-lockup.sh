#!/usr/bin/env bash
# The load that once locked up soft-RoCE guests (docs/fabric.md, "Guest
# kernel settings"): two guests, eight-QP ib_write_bw both ways, both of h1's
# uplinks and one of h2's limited by tbf for 20 s of each round. Counts the
# soft lockups and transmit-queue timeouts the guests' kernels report.
# Usage: bench/guest-lockup.sh [ROUNDS]   (default 2; about 3 minutes each)
set -u
cd "$(dirname "$0")/.."
FAB=$PWD/tools/shunt-fabric
NAME=gl$$
export SHUNT_FABRIC_GUEST=${BUILD:-$PWD/build}/guest
rounds=${1:-2}
out=$(mktemp -d)
trap '"$FAB" --name $NAME down >/dev/null 2>&1; rm -rf "$out"' EXIT
"$FAB" --name $NAME up --hosts 2 --rails 1 --spines 2 >/dev/null || { echo "fabric did not come up"; exit 1; }
fab() { "$FAB" --name $NAME "$@"; }
a1=$(fab addr h1 r0); a2=$(fab addr h2 r0)
g1=$(fab gid h1 rxe0); g2=$(fab gid h2 rxe0)
cons=${SHUNT_FABRIC_STATE:-/run/shunt-fabric}/$NAME
bw() {  # HOST GID PORT [SERVER]
  fab exec "$1" -- timeout 120 ib_write_bw -F -d rxe0 -x "$2" -q 8 -s 65536 -D 45 -p "$3" ${4:-}
}
lockups=0
for r in $(seq 1 "$rounds"); do
  bw h2 "$g2" 18515 > "$out/s1" 2>&1 &
  bw h1 "$g1" 18516 > "$out/s2" 2>&1 &
  fab wait-port h2 18515 >/dev/null; fab wait-port h1 18516 >/dev/null
  bw h1 "$g1" 18515 "$a2" > "$out/c1" 2>&1 &
  bw h2 "$g2" 18516 "$a1" > "$out/c2" 2>&1 &
  sleep 10
  for l in l1r0-s1:3 l1r0-s2:3 l2r0-s1:5; do fab fault rate "${l%:*}" "${l#*:}"; done
  sleep 20
  for l in l1r0-s1 l1r0-s2 l2r0-s1; do fab fault rate "$l" 0; done
  wait
  n=$(cat "$cons"/*.console | grep -a -c -e 'soft lockup' -e 'NETDEV WATCHDOG')
  echo "round $r: $n lockup or transmit-timeout reports so far; h1->h2 $(awk 'NF == 5 && $1 == 65536 { print $4 " MB/s" }' "$out/c1")"
  lockups=$n
  [ "$n" -gt 0 ] && break  # a locked guest carries nothing more
done
echo "guest lockups: $lockups in $r rounds"
