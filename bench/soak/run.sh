#!/usr/bin/env bash
# make soak: libshunt in a long job on the soft-RoCE guests. Not part of
# `make test` or `make bench` (over 100 minutes with the defaults).
# 1. No fault: SOAK_MINUTES (default 30) of a 4-rank all-to-all in each
#    spreading mode of SOAK_MODES (default "pin flowlet split"), libshunt's
#    defaults otherwise (bench/false-failures.sh): every path failure is a
#    false one. Reported per mode: path failures (per path-hour), replays.
# 2. Faults: SOAK_FAULT_MINUTES (default 10) of a 4-rank all-to-all over 2
#    rails and 2 spines (libshunt's defaults) while a fault of a random kind
#    (every kind shunt-fabric injects into a running job: link-down of an
#    uplink or a host link, blackhole, flap, rate, loss, port-down) hits a
#    random link or port every 5-15 s for 2-8 s, healed before the next; in
#    the last 40 s one host's rail-1 NIC is removed for good (nic-remove).
#    SOAK_SEED seeds the draw. The job must see no error and no wrong byte.
# Exits 1 when phase 1 saw a path failure or a replay, or phase 2 an
# application error, a wrong byte or a rank that did not end cleanly.
SHUNT_ROOT=$(cd "$(dirname "$0")/../.." && pwd)
MINUTES=${SOAK_MINUTES:-30}
FAULT_MINUTES=${SOAK_FAULT_MINUTES:-10}
MODES=${SOAK_MODES:-pin flowlet split}
RANDOM=${SOAK_SEED:-$$}
case "$MINUTES$FAULT_MINUTES" in *[!0-9]*)
  echo "soak: SOAK_MINUTES and SOAK_FAULT_MINUTES are whole minutes (0 skips that phase)" >&2
  exit 2 ;;
esac
status=0

if [ "$MINUTES" -gt 0 ]; then
  echo "== phase 1: no fault, $MINUTES min per mode ($MODES)"
  out=$(mktemp)
  FF_SECONDS=$((MINUTES * 60)) FF_MODES="$MODES" "$SHUNT_ROOT/bench/false-failures.sh" | tee "$out"
  rc=${PIPESTATUS[0]}
  [ "$rc" = 0 ] || { echo "phase 1: bench/false-failures.sh exited $rc"; status=1; }
  python3 - "$out" <<'PY' || status=1
import re, sys
bad = []
rows = [l for l in open(sys.argv[1]) if re.match(r"^\S+\s+app errors", l)]
for l in rows:
    mode = l.split()[0]
    n = {k: int(v) for k, v in re.findall(r"(app errors|path failures|replays) (\d+)", l)}
    if any(n.values()):
        bad.append(f"{mode}: {n}")
if not rows:
    bad.append("no result rows")
if "did not run to its end" in open(sys.argv[1]).read():
    bad.append("a run did not reach its end")
print("phase 1:", "; ".join(bad) if bad else "no path failure, no replay, no application error")
sys.exit(1 if bad else 0)
PY
  rm -f "$out"
fi

[ "$FAULT_MINUTES" -gt 0 ] || exit $status
echo
echo "== phase 2: random faults for $FAULT_MINUTES min"
# The fabric library brings up the guests and takes them down on exit.
. "$SHUNT_ROOT/test/fabric/lib.sh"
need_guests
BENCH=$B/bin/shunt-bench
HOSTS=4
DUR=$((FAULT_MINUTES * 60))
up --hosts $HOSTS --rails 2 --spines 2
port=$((30000 + RANDOM % 2000))
key=soak-$RANDOM-$RANDOM
pids=()
for ((r = HOSTS - 1; r >= 0; r--)); do
  fab exec h$((r + 1)) -- sh -c 'rm -f /tmp/soak-events.jsonl /tmp/soak-stats.json; exec "$@"' sh \
    timeout $((DUR + 180)) env LD_PRELOAD="$LIB" SHUNT_JOB_KEY="$key" SHUNT_EVENT_LOG=/tmp/soak-events.jsonl \
    SHUNT_STATS_FILE=/tmp/soak-stats.json "$BENCH" --rank $r --world $HOSTS --bootstrap "$(fab addr h1 r0):$port" \
    --transport verbs --verb write_imm -d rxe0 -b 1M -e 1M -w 1 --duration "$DUR" -c 1 --seg 256K \
    --stall-timeout 60 --qp-timeout 18 > "$TMP/rank$r" 2>&1 &
  pids+=($!)
done

pick() { local a=("$@"); echo "${a[RANDOM % ${#a[@]}]}"; }
uplinks=() hostlinks=() ports=()
for ((h = 1; h <= HOSTS; h++)); do
  for r in 0 1; do
    uplinks+=("l${h}r$r-s1" "l${h}r$r-s2")
    hostlinks+=("h$h-r$r")
    ports+=("h$h r$r")
  done
done
# fault KIND: one fault of KIND, held 2-8 s, then healed; logged with its times
fault() {
  local kind=$1 hold=$((2 + RANDOM % 7)) what t0=$SECONDS rc=0
  case $kind in
    link-down) what=$(pick "${uplinks[@]}" "${hostlinks[@]}")
      fab fault link-down "$what" >/dev/null && sleep "$hold" && fab fault link-up "$what" >/dev/null || rc=$? ;;
    blackhole) what=$(pick "${uplinks[@]}" "${hostlinks[@]}")
      fab fault blackhole "$what" >/dev/null && sleep "$hold" && fab fault unblackhole "$what" >/dev/null || rc=$? ;;
    flap) what=$(pick "${uplinks[@]}")
      fab fault flap "$what" --period 500 --count $((hold * 2)) >/dev/null || rc=$? ;;
    rate) what=$(pick "${uplinks[@]}")
      fab fault rate "$what" 2 >/dev/null && sleep "$hold" && fab fault rate "$what" 0 >/dev/null || rc=$? ;;
    loss) what=$(pick "${uplinks[@]}")
      fab fault loss "$what" 5 >/dev/null && sleep "$hold" && fab fault loss "$what" 0 >/dev/null || rc=$? ;;
    port-down) what=$(pick "${ports[@]}")
      # shellcheck disable=SC2086  # "HOST NIC"
      fab fault port-down $what >/dev/null && sleep "$hold" && fab fault port-up $what >/dev/null || rc=$? ;;
    nic-remove) what="h$((2 + RANDOM % (HOSTS - 1))) r1"
      # shellcheck disable=SC2086
      fab fault nic-remove $what >/dev/null || rc=$? ;;
  esac
  echo "$t0 $((SECONDS - t0)) $kind $what$([ "$rc" = 0 ] || echo " (failed: exit $rc)")" >> "$TMP/faults"
  [ "$rc" = 0 ] || echo "soak: fault $kind $what failed (exit $rc)"
}
: > "$TMP/faults"
start=$SECONDS
sleep 20  # the job's bundles up and its traffic flowing
removed=0
while ((SECONDS - start < DUR - 20)); do
  if ((removed == 0 && SECONDS - start >= DUR - 40)); then
    fault nic-remove
    removed=1
  else
    fault "$(pick link-down blackhole flap rate loss port-down)"
  fi
  sleep $((5 + RANDOM % 11))
done
rcs=()
for p in "${pids[@]}"; do wait "$p"; rcs+=($?); done
for ((r = 0; r < HOSTS; r++)); do
  fab exec h$((r + 1)) -- cat /tmp/soak-events.jsonl > "$TMP/events$r" 2>/dev/null
  fab exec h$((r + 1)) -- cat /tmp/soak-stats.json > "$TMP/stats$r" 2>/dev/null
done
echo "faults (start s, held s, kind, where):"
sed 's/^/  /' "$TMP/faults"
python3 - "$TMP" "$HOSTS" "${rcs[*]}" <<'PY' || status=1
import collections, json, re, sys
tmp, hosts, rcs = sys.argv[1], int(sys.argv[2]), sys.argv[3].split()
bad, by = [], collections.Counter()
errors = wrong = replays = rows = 0
for r in range(hosts):
    # the ranks were started last to first: rcs[0] is the last rank's
    rc = rcs[hosts - 1 - r]
    if rc != "0":
        bad.append(f"rank {r} exited {rc}")
    out = open(f"{tmp}/rank{r}", errors="replace").read()
    m = re.search(r"Errors seen\s*:\s*(\d+)", out)
    if r == 0 and not m:
        bad.append("rank 0: no summary")
    errors += int(m.group(1)) if m else 0
    errors += len(re.findall(r"^shunt-bench: rank \d+: error:", out, re.M))
    for line in out.splitlines():
        f = line.split()
        if len(f) == 13 and f[0].isdigit():
            rows += 1
            wrong += int(f[8]) if f[8].isdigit() else 1
    try:
        for line in open(f"{tmp}/events{r}", errors="replace"):
            try:
                e = json.loads(line)
            except ValueError:
                continue
            if e.get("event") == "path_down" and "->" not in str(e.get("path", "")):
                by[e.get("status") or "other"] += 1
        replays += json.load(open(f"{tmp}/stats{r}")).get("replays", 0)
    except (OSError, ValueError):
        bad.append(f"rank {r}: no events or stats")
if errors:
    bad.append(f"{errors} application errors")
if wrong:
    bad.append(f"{wrong} wrong (the #wrong column)")
if not rows:
    bad.append("no result rows")
print("phase 2: paths failed", sum(by.values()), dict(sorted(by.items())), " replays", replays,
      " application errors", errors, " #wrong", wrong)
print("phase 2:", "; ".join(bad) if bad else "every fault ridden out: no error, no wrong byte")
sys.exit(1 if bad else 0)
PY
exit $status
