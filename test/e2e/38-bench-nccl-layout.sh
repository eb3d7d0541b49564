#!/usr/bin/env bash
# timeout: 60
# shunt-bench speaks nccl-tests: an out-of-place and an in-place column
# group (13 columns, the out-of-place #wrong in column 9), the check on by
# default (-c 1) and off with -c 0; under Slurm's srun the ranks come from
# SLURM_PROCID / SLURM_NTASKS, and a --world that contradicts the
# launcher's world size is a usage error (64), not a one-rank run.
set -u
. "$(dirname "$0")/bench-lib.sh"

# 1. the two column groups, the check on by default
timeout 30 "$BENCH" -b 64K -e 128K -n 2 -w 1 >"$WORK/one.out" 2>&1 || { cat "$WORK/one.out"; fail "single rank"; }
cat "$WORK/one.out"
grep -Eq '^#[[:space:]]+out-of-place[[:space:]]+in-place[[:space:]]*$' "$WORK/one.out" || fail "no group header"
grep -Eq '^#[[:space:]]+size[[:space:]]+count[[:space:]]+type[[:space:]]+redop[[:space:]]+root([[:space:]]+time[[:space:]]+algbw[[:space:]]+busbw[[:space:]]+#wrong){2}[[:space:]]*$' \
  "$WORK/one.out" || fail "column names are not the two nccl-tests groups"
grep -q 'validation: 1' "$WORK/one.out" || fail "check not on by default"
expect_wrong "$WORK/one.out" 0
# -c 0: no check, #wrong N/A
timeout 30 "$BENCH" -b 64K -e 64K -n 2 -w 1 -c 0 >"$WORK/nocheck.out" 2>&1 || { cat "$WORK/nocheck.out"; fail "-c 0"; }
rows "$WORK/nocheck.out" | awk 'NF != 13 || $9 != "N/A" { bad = 1 } END { exit bad }' || fail "-c 0 still checks"

# 2. the check by default finds a corrupted byte: exit 1
timeout 30 "$BENCH" -b 64K -e 64K -n 2 -w 1 --corrupt >"$WORK/bad.out" 2>&1; rc=$?
[ $rc = 1 ] || { cat "$WORK/bad.out"; fail "corrupted run without -c exited $rc, want 1"; }

# 3. Slurm: two ranks from SLURM_PROCID / SLURM_NTASKS
port=$(free_port)
SLURM_PROCID=1 SLURM_NTASKS=2 SHUNT_BENCH_BOOTSTRAP=127.0.0.1:$port \
  timeout 30 "$BENCH" -b 64K -e 64K -n 2 -w 1 >"$WORK/s1.log" 2>&1 &
PIDS+=($!)
SLURM_PROCID=0 SLURM_NTASKS=2 SHUNT_BENCH_BOOTSTRAP=127.0.0.1:$port \
  timeout 30 "$BENCH" -b 64K -e 64K -n 2 -w 1 >"$WORK/slurm.out" 2>&1 || { cat "$WORK/slurm.out" "$WORK/s1.log"; fail "Slurm run"; }
grep -q ', 2 ranks' "$WORK/slurm.out" || { cat "$WORK/slurm.out"; fail "world size not taken from SLURM_NTASKS"; }
grep -q '#  Rank  1 ' "$WORK/slurm.out" || fail "rank 1 not in the run"
expect_wrong "$WORK/slurm.out" 0

# 4. --world against the launcher's size: an error before anything runs
for env in "SLURM_PROCID=0 SLURM_NTASKS=4" "OMPI_COMM_WORLD_RANK=0 OMPI_COMM_WORLD_SIZE=4" "PMI_RANK=0 PMI_SIZE=4"; do
  env $env timeout 10 "$BENCH" --world 1 -b 64K -e 64K -n 1 >"$WORK/mm.out" 2>"$WORK/mm.err"; rc=$?
  [ $rc = 64 ] || { cat "$WORK/mm.out" "$WORK/mm.err"; fail "$env --world 1 exited $rc, want 64"; }
  grep -q -- '--world 1, but the launcher started 4 ranks' "$WORK/mm.err" || { cat "$WORK/mm.err"; fail "$env: mismatch not named"; }
  [ ! -s "$WORK/mm.out" ] || fail "$env: ran anyway"
done
# the same size is fine
env SLURM_PROCID=0 SLURM_NTASKS=1 timeout 10 "$BENCH" --world 1 -b 64K -e 64K -n 1 >/dev/null 2>&1 ||
  fail "--world equal to SLURM_NTASKS refused"
echo ok
