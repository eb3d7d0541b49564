#!/usr/bin/env bash
# timeout: 60
# Ranks take their place from mpirun's environment (OMPI_COMM_WORLD_RANK /
# _SIZE, or PMI_RANK / PMI_SIZE) and the bootstrap from
# SHUNT_BENCH_BOOTSTRAP; sizes accept K/M/G suffixes; one rank alone works.
set -u
. "$(dirname "$0")/bench-lib.sh"

port=$(free_port)
for r in 1 2; do
  OMPI_COMM_WORLD_RANK=$r OMPI_COMM_WORLD_SIZE=3 SHUNT_BENCH_BOOTSTRAP=127.0.0.1:$port \
    timeout 30 "$BENCH" -b 3K -e 3M -f 32 -n 3 -w 1 -c 1 >"$WORK/o$r.log" 2>&1 &
  PIDS+=($!)
done
OMPI_COMM_WORLD_RANK=0 OMPI_COMM_WORLD_SIZE=3 SHUNT_BENCH_BOOTSTRAP=127.0.0.1:$port \
  timeout 30 "$BENCH" -b 3K -e 3M -f 32 -n 3 -w 1 -c 1 >"$WORK/ompi.out" 2>&1 || { cat "$WORK"/*; fail "Open MPI env run"; }
cat "$WORK/ompi.out"
grep -q ', 3 ranks' "$WORK/ompi.out" || fail "world size not taken from OMPI_COMM_WORLD_SIZE"
expect_wrong "$WORK/ompi.out" 0
rows "$WORK/ompi.out" | awk '{ print $1 }' | tr '\n' ' ' | grep -q '^3072 98304 3145728 $' || fail "K/M sizes"

port=$(free_port)
PMI_RANK=1 PMI_SIZE=2 timeout 30 "$BENCH" --bootstrap 127.0.0.1:$port -b 64K -e 64K -n 2 -c 1 >/dev/null 2>&1 &
PIDS+=($!)
PMI_RANK=0 PMI_SIZE=2 timeout 30 "$BENCH" --bootstrap 127.0.0.1:$port -b 64K -e 64K -n 2 -c 1 >"$WORK/pmi.out" 2>&1 ||
  { cat "$WORK/pmi.out"; fail "PMI env run"; }
expect_wrong "$WORK/pmi.out" 0

timeout 30 "$BENCH" -b 64K -e 64K -n 2 -c 1 >"$WORK/one.out" 2>&1 || { cat "$WORK/one.out"; fail "single rank"; }
expect_wrong "$WORK/one.out" 0
echo ok
