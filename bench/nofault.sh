#!/usr/bin/env bash
# What libshunt costs when nothing fails, on soft-RoCE guests: NOFAULT_HOSTS
# guests (default 4), 2 rails, 2 spines, no rate limit, no fault. A
# shunt-bench all-to-all (1 MiB, 64 KiB WRs, -c 1) runs without libshunt,
# then with it in its default mode (only SHUNT_JOB_KEY set), then with each
# of NOFAULT_VARIANTS ("VAR=VALUE,VAR=VALUE ..." each, default none),
# interleaved NOFAULT_ROUNDS times (default 3). Reported per run: the time
# per iteration (ms) and the CPU that shunt's own threads of rank 0's
# process used (share of the guest's CPU time, by thread name); then the
# median of each kind and its ratio to the one without. A run that fails
# (rxe 6.1 on a starved guest can end a QP with a remote invalid request
# error, with or without libshunt) is run again, twice at most, and said.
# Each run also says how busy rank 0's guest was: soft-RoCE spends the
# guest's CPU per segment, but on a host shared with other work the
# emulator's own threads (the vCPU, the NIC's I/O), not the guest, may be
# what limits; a guest mostly idle says so.
# A job's first seconds with libshunt carry its setup (shadows created and
# connected, path discovery, the probe engine's start); a job of hours
# does not feel them. So each run also says what rank 0 received per second
# over its last NOFAULT_STEADY_S seconds (default: the second half of
# NOFAULT_SECONDS, default 40), and the summary gives that steady state's
# ratio beside the whole run's.
SHUNT_ROOT=$(cd "$(dirname "$0")/.." && pwd)
. "$SHUNT_ROOT/test/fabric/lib.sh"
. "$SHUNT_ROOT/bench/nofault-workload.sh"
need_guests
BENCH=$B/bin/shunt-bench
HOSTS=${NOFAULT_HOSTS:-4}
ROUNDS=${NOFAULT_ROUNDS:-3}
DUR=${NOFAULT_SECONDS:-40}
STEADY=${NOFAULT_STEADY_S:-$((DUR / 2))}
up --hosts "$HOSTS" --rails 2 --spines 2

# run KIND ENV...: the time per iteration (ms) in $TMP/KIND.ms, rank 0's
# MB/s over the last $STEADY s in $TMP/KIND.steady, thread CPU in
# $TMP/KIND.cpu; fails when the benchmark did
run() {
  local kind=$1 r pids=() port=$((30000 + RANDOM % 2000))
  shift
  local env=(env "$@")
  nofault_args "$HOSTS" "$DUR" "$port"
  fab exec h1 -- env THREAD_CPU_DETAIL=1 bash "$SHUNT_ROOT/bench/thread-cpu.sh" shunt-bench $((DUR / 3)) $((DUR / 2)) \
    > "$TMP/$kind.cpu" 2>&1 &
  local cpu=$!
  for ((r = HOSTS - 1; r >= 0; r--)); do
    fab exec h$((r + 1)) -- timeout $((DUR + 90)) "${env[@]}" "$BENCH" --rank $r "${NOFAULT_ARGS[@]}" > "$TMP/$kind.rank$r" 2>&1 &
    pids+=($!)
  done
  local rc=0 p
  for p in "${pids[@]}"; do wait "$p" || rc=1; done
  wait "$cpu"
  # the result row: size count type redop root time(us) ...
  awk '$1 ~ /^[0-9]+$/ && NF == 13 && $9 == 0 { printf "%.2f\n", $6 / 1000 }' "$TMP/$kind.rank0" | tail -n 1 > "$TMP/$kind.ms"
  # the timeline rows: #T wall(s) t(s) bytes GB/s errors
  steady_mbs $((DUR - STEADY)) "$TMP/$kind.rank0" > "$TMP/$kind.steady"
  [ $rc = 0 ] && [ -s "$TMP/$kind.ms" ]
}

# cpu KIND -> "shunt's threads P% (name P% ...), guest busy P%"
cpu() {
  python3 - "$TMP/$1.cpu" <<'PY'
import sys
helpers = total = idle = None
names = {}
for line in open(sys.argv[1]):
    f = line.split()
    if f[:1] == ["helpers"]:
        helpers, total = int(f[1]), int(f[3])
        idle = int(f[5]) if len(f) > 5 else None
    elif f[:1] == ["thread"]:
        names[f[1]] = int(f[2])
if not total:
    print("no CPU figures")
else:
    detail = " ".join(f"{n} {100 * t / total:.1f}%" for n, t in sorted(names.items(), key=lambda x: -x[1]) if t)
    busy = f", guest busy {100 - 100 * idle / total:.0f}%" if idle is not None else ""
    print(f"shunt's threads {100 * helpers / total:.1f}% ({detail or 'none'}){busy}")
PY
}

KEY=nofault-$$
kinds=(without default)
declare -A envs=([without]="" [default]="LD_PRELOAD=$LIB SHUNT_JOB_KEY=$KEY")
i=0
for v in ${NOFAULT_VARIANTS:-}; do
  i=$((i + 1))
  kinds+=("v$i")
  envs[v$i]="LD_PRELOAD=$LIB SHUNT_JOB_KEY=$KEY ${v//,/ }"
done
declare -A got steady
for ((round = 1; round <= ROUNDS; round++)); do
  for k in "${kinds[@]}"; do
    tries=0
    # shellcheck disable=SC2086
    until run "$k" ${envs[$k]}; do
      tries=$((tries + 1))
      echo "round $round, $k: the run failed ($(grep -m1 -h 'error' "$TMP/$k".rank* | head -n 1)); again"
      [ $tries -lt 3 ] || fail "the $k run failed three times"
    done
    ms=$(cat "$TMP/$k.ms")
    st=$(cat "$TMP/$k.steady")
    got[$k]+="$ms "
    [ -n "$st" ] && steady[$k]+="$st "
    echo "round $round, $k (${envs[$k]:-no libshunt}): $ms ms per iteration, ${st:-no} MB/s received in the last ${STEADY} s; $(cpu "$k")"
  done
done
med() { python3 -c 'import statistics, sys; print(statistics.median(map(float, sys.argv[1:])))' "$@"; }
base=$(med ${got[without]})
sbase=$(med ${steady[without]:-0})
for k in "${kinds[@]}"; do
  python3 - "$base" "$sbase" "$k" "${envs[$k]:-no libshunt}" "$STEADY" "${steady[$k]}" ${got[$k]} <<'PY'
import statistics, sys
base, sbase, kind, env, span = float(sys.argv[1]), float(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5]
sts = list(map(float, sys.argv[6].split()))
m = statistics.median(map(float, sys.argv[7:]))
steady = "no timeline"
if sts:
    st = statistics.median(sts)
    steady = f"{st:.2f} MB/s, " + (f"{st / sbase:.2f}x" if sbase > 0 else "n/a")
print(f"{kind:8s} median {m:.2f} ms per iteration, {base / m:.2f}x of no libshunt; "
      f"last {span} s {steady} ({env})")
PY
done
