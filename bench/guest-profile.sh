#!/usr/bin/env bash
# Where a rank's guest spends its CPU with and without libshunt: the
# no-fault workload of bench/nofault.sh (4 guests, 2 rails, 2 spines, a
# 4-rank 1 MiB all-to-all in 64 KiB WRITE_WITH_IMMs, -c 1), one run per
# kind in PROFILE_KINDS (default "without default"; also "ppr0":
# SHUNT_PATHS_PER_RAIL=0, "noprobe": probing all but off), each profiled in
# rank 0's guest by `perf record -a` for PROFILE_SPAN s (default 12) from
# 20 s in. Per kind: what rank 0 received per second over the run's second
# half, how busy the guest was, its busy time per MB received, the
# threads that spent it, and the share in the virtio NIC's notify
# (vp_notify: each one an exit to the emulator, whose cost on these
# emulated guests a real NIC's doorbell does not have).
SHUNT_ROOT=$(cd "$(dirname "$0")/.." && pwd)
. "$SHUNT_ROOT/test/fabric/lib.sh"
. "$SHUNT_ROOT/bench/nofault-workload.sh"
need_guests
command -v perf >/dev/null || skip "no perf (Debian's linux-perf)"
BENCH=$B/bin/shunt-bench
DUR=40 SPAN=${PROFILE_SPAN:-12}
up --hosts 4 --rails 2 --spines 2
KEY=profile-$$
# The guest's side: profile, then report by thread name and DSO, and by symbol.
cat > "$TMP/guest.sh" <<GUEST
sleep 20
perf record -a -F 199 -o /tmp/p.data -- sleep $SPAN >/dev/null 2>&1
perf report -i /tmp/p.data --sort comm,dso --stdio 2>/dev/null | grep -v '^#' | grep -v '^\$' > /tmp/p.comm
perf report -i /tmp/p.data --sort comm,sym --stdio 2>/dev/null | grep -v '^#' | grep -v '^\$' | head -n 60 > /tmp/p.sym
perf report -i /tmp/p.data --sort sym --stdio 2>/dev/null | grep -w vp_notify > /tmp/p.notify
GUEST
run() {
  local kind=$1 r pids=() port=$((30000 + RANDOM % 2000))
  shift
  nofault_args 4 "$DUR" "$port"
  fab exec h1 -- bash -c "$(cat "$TMP/guest.sh")" &
  local prof=$!
  for ((r = 3; r >= 0; r--)); do
    fab exec h$((r + 1)) -- timeout $((DUR + 90)) env "$@" "$BENCH" --rank $r "${NOFAULT_ARGS[@]}" > "$TMP/$kind.rank$r" 2>&1 &
    pids+=($!)
  done
  for p in "${pids[@]}"; do wait "$p"; done
  wait $prof
  for f in comm sym notify; do fab exec h1 -- cat /tmp/p.$f > "$TMP/$kind.$f"; done
  steady_mbs $((DUR / 2)) "$TMP/$kind.rank0" > "$TMP/$kind.mbs"
}
report() {
  python3 - "$TMP" "$1" <<'PY'
import re, sys
d, kind = sys.argv[1], sys.argv[2]
mbs = float(open(f"{d}/{kind}.mbs").read() or 0)
by = {}
for line in open(f"{d}/{kind}.comm"):
    m = re.match(r"\s*([0-9.]+)%\s+(\S+)", line)
    if m: by[m.group(2)] = by.get(m.group(2), 0) + float(m.group(1))
busy = 100 - by.get("swapper", 0)
notify = sum(float(m.group(1)) for m in (re.match(r"\s*([0-9.]+)%", l) for l in open(f"{d}/{kind}.notify")) if m)
top = ", ".join(f"{c} {p:.1f}%" for c, p in sorted(by.items(), key=lambda x: -x[1]) if c != "swapper" and p >= 0.5)
per = f"{busy / mbs:.1f}% busy per MB/s" if mbs > 0 else "n/a"
print(f"{kind}: {mbs:.2f} MB/s, guest busy {busy:.1f}% ({per}), in vp_notify {notify:.1f}%; {top}")
PY
}
declare -A envs=([without]="" [default]="LD_PRELOAD=$LIB SHUNT_JOB_KEY=$KEY"
  [ppr0]="LD_PRELOAD=$LIB SHUNT_JOB_KEY=$KEY SHUNT_PATHS_PER_RAIL=0"
  [noprobe]="LD_PRELOAD=$LIB SHUNT_JOB_KEY=$KEY SHUNT_PROBE_INTERVAL_MS=10000 SHUNT_PATH_DEAD_MS=600000")
for k in ${PROFILE_KINDS:-without default}; do
  [ -n "${envs[$k]+x}" ] || fail "unknown kind $k (without, default, ppr0, noprobe)"
  # shellcheck disable=SC2086
  run "$k" ${envs[$k]}
  report "$k"
  [ -n "${PROFILE_KEEP:-}" ] && cp "$TMP/$k".* "$PROFILE_KEEP"/ 2>/dev/null
done
exit 0
