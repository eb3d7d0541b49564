#!/usr/bin/env bash
# shunt-bench-contention: two all-to-all jobs colliding on a fabric whose
# spines, not the hosts, are the bottleneck; run without libshunt, with
# shunt's static spreading only (split, SHUNT_STEER=off) and with steering
# by segment latency (SHUNT_STEER=latency) and by the probes' forward
# queues (SHUNT_STEER=queue), and with each QP's work pinned to one path
# whose carrier steering moves whole off a congested spine (carrier:
# SHUNT_SPREAD=pin, SHUNT_STEER=queue). `shunt-bench scenario contention`
# runs it.
#
# Usage: shunt-bench scenario contention [options]
#   --rate MBIT   every leaf-spine link, each way (default 10: the guests
#                 are emulated; on two host cores two jobs on four guests
#                 at 20 Mbit/s moved only two thirds of what the spines
#                 carry, and at 5 most runs were still the guests')
#   --duration S  seconds per run (default 30)
#   --tries N     runs without libshunt until one collides (default 4)
#   --paths N     shadow paths per bundle (default 8)
#   --hosts N     2 (default): both jobs on the same two hosts (h1<->h2,
#                 one per leaf) as separate processes, half the guests, so
#                 on a small machine the spines rather than the guests'
#                 CPUs limit (the spines ran 97% full); 4: job A h1<->h3,
#                 job B h2<->h4 (--same-hosts: --hosts 2)
#   --no-solo     skip the runs without contention (job A alone, static
#                 spreading and each split steering mode, after the rest)
#   --warmup N    untimed iterations per run first (shunt-bench -w,
#                 default 4; each iteration is one message per peer each
#                 way, and the next waits for it)
#   --modes M     which runs with libshunt, of static, latency, queue and
#                 carrier (default "static latency queue carrier")
#   --out DIR     JSON, stats, events and the plot (default ./scenario-contention)
#   --keep        leave the fabric up afterwards
# Topology: 2 (or 4) guests, one (two) per leaf, 2 spines, one rail; the
# routers hash source and destination address and UDP source port
# (shunt-fabric --ecmp-hash sport), so the host agents' probes from each
# shadow's source port follow that shadow's spine. Each job has 2 ranks,
# one per leaf (WRITE_WITH_IMM of 256 KiB): every byte crosses a spine.
# A run "collides" when one of leaf 1's uplinks carried >= 90% of what
# crossed. Printed per mode: each job's MB/s, their sum, the max-min fair
# ideal (both spines full, split evenly: each job one spine's worth each
# way, of payload: a RoCE packet's headers take 5% of the wire), each job
# against its fair share, steering steps and reversals per bundle per
# second, job A alone with each split mode (target: steering >= 0.98x
# static), and a timeline plot of every run.
# Exit: 0 when every run was carried out, 2 when the fabric or a run failed,
# 77 when no fabric can be built here.
set -u
rate=10 duration=30 tries=4 paths=8 warmup=4 same=1 solo=1 modes="static latency queue carrier" out= keep=0
while [ $# -gt 0 ]; do
  case $1 in
    --rate) rate=$2; shift ;;
    --duration) duration=$2; shift ;;
    --tries) tries=$2; shift ;;
    --paths) paths=$2; shift ;;
    --warmup) warmup=$2; shift ;;
    --same-hosts) same=1 ;;
    --hosts) case $2 in 2) same=1 ;; 4) same=0 ;; *) echo "shunt-bench-contention: --hosts is 2 or 4, not $2" >&2; exit 64 ;; esac; shift ;;
    --no-solo) solo=0 ;;
    --modes) modes=$2; shift ;;
    --out) out=$2; shift ;;
    --keep) keep=1 ;;
    -h|--help) sed -n '2,46p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "shunt-bench-contention: unknown option $1" >&2; exit 64 ;;
  esac
  shift
done
here=$(cd "$(dirname "$0")" && pwd)
bench=${SHUNT_BENCH:-$here/shunt-bench}
fabric=$here/shunt-fabric
# libshunt beside this script (build tree or PREFIX/lib/shunt), or in the
# build that SHUNT_ROOT or BUILD name
if [ -n "${SHUNT_ROOT:-}${BUILD:-}" ]; then
  root=${SHUNT_ROOT:-$(cd "$here/../.." && pwd)}
  [ -x "$fabric" ] || fabric=$root/tools/shunt-fabric
  case ${BUILD:-build} in /*) shim=$BUILD/lib/libshunt.so ;; *) shim=$root/${BUILD:-build}/lib/libshunt.so ;; esac
else
  shim=$here/../lib/libshunt.so
  [ -f "$shim" ] || shim=$here/../lib/shunt/libshunt.so
fi
[ -x "$fabric" ] || { echo "shunt-bench-contention: shunt-fabric not found"; exit 77; }
[ -x "$bench" ] || { echo "shunt-bench-contention: $bench not built"; exit 77; }
[ -f "$shim" ] || { echo "shunt-bench-contention: $shim not built (make)"; exit 77; }
out=${out:-$PWD/scenario-contention}
mkdir -p "$out" && out=$(cd "$out" && pwd)
fab_name=ct$$
fab() { "$fabric" --name "$fab_name" "$@"; }
agents=()
cleanup() {
  local p
  for p in "${agents[@]}"; do kill "$p" 2>/dev/null; wait "$p" 2>/dev/null; done
  [ $keep = 1 ] || fab down >/dev/null 2>&1
}
trap cleanup EXIT
trap 'exit 130' INT TERM

echo "scenario contention: two 2-rank all-to-all jobs ($([ $same = 1 ] && echo "both h1<->h2" || echo "h1<->h3, h2<->h4")), spines at $rate Mbit/s, ${duration}s per run"
if [ $same = 1 ]; then
  hosts="h1 h2" ja_hosts="h1 h2" jb_hosts="h1 h2" per_leaf=1
else
  hosts="h1 h2 h3 h4" ja_hosts="h1 h3" jb_hosts="h2 h4" per_leaf=2
fi
fab up --hosts $(wc -w <<<"$hosts") --rails 1 --spines 2 --hosts-per-leaf $per_leaf --ecmp-hash sport >"$out/fabric.log" 2>&1 ||
  { cat "$out/fabric.log"; echo "shunt-bench-contention: cannot bring up the fabric"; exit 2; }
# Deep queues (2 s): rxe recovers badly from drops (go-back-N after a
# timeout), so the spines queue rather than drop; ACK timeout ~2 s to match.
for l in 1 2; do for s in 1 2; do
  fab fault rate "l${l}r0-s$s" "$rate" --queue-ms 2000 >/dev/null || { echo "shunt-bench-contention: rate l${l}r0-s$s"; exit 2; }
done; done
key=contention-$fab_name-$RANDOM
declare -A addr
for h in $hosts; do addr[$h]=$(fab addr $h r0); done
# Each host's agent, started before the jobs: the first preloaded process
# of a host to open a socket becomes its agent, and its probe engine learns
# every peer's clock and clear base delay before the jobs load the spines.
# Hosts are named by their address, as the agents name the peers of bundles.
peer_list() { local h s=""; for h in "$@"; do s+="${addr[$h]}=${addr[$h]} "; done; echo "$s"; }
for h in $hosts; do
  case $same:$h in 1:h1) p=h2 ;; 1:h2) p=h1 ;; 0:h1) p=h3 ;; 0:h3) p=h1 ;; 0:h2) p=h4 ;; 0:h4) p=h2 ;; esac
  fab exec $h -- env LD_PRELOAD="$shim" SHUNT_JOB_KEY="$key" SHUNT_PROBE_ADDRS="${addr[$h]}" SHUNT_PROBE_NAME="${addr[$h]}" \
    SHUNT_PEERS="$(peer_list $p)" SHUNT_PROBE_INTERVAL_MS=50 SHUNT_PATH_DEAD_MS=8000 SHUNT_LOG_LEVEL=info \
    python3 -c "import socket, time; s = socket.socket(); time.sleep($((6 * duration + 600)))" >"$out/agent-$h.log" 2>&1 &
  agents+=($!)
done
sleep 8

# job MODE TAG A B PORT: a 2-rank job, rank 0 on host A
job() {
  local mode=$1 tag=$2 a=$3 b=$4 port=$5 env=(env)
  case $mode in
    static|latency|queue|carrier) env=(env LD_PRELOAD="$shim" SHUNT_MODE=active SHUNT_SPLIT_MIN_BYTES=65536
      SHUNT_SPREAD=$([ $mode = carrier ] && echo pin || echo split)
      SHUNT_JOB_KEY="$key" SHUNT_PATHS_PER_RAIL="$paths" SHUNT_PATH_DEAD_MS=8000
      SHUNT_STEER=$(case $mode in static) echo off ;; carrier) echo queue ;; *) echo $mode ;; esac) SHUNT_LOG_LEVEL=info
      SHUNT_STATS_FILE=/tmp/contention-$tag.json SHUNT_EVENT_LOG=/tmp/contention-events-$tag.jsonl) ;;
  esac
  local args=(--world 2 --bootstrap "${addr[$a]}:$port" --transport verbs -d rxe0 --verb write_imm -b 256K -e 256K
    --duration "$duration" -w "$warmup" -c 1 --seg 256K --qp-timeout 19 --stall-timeout 60 -q --timeline 500)
  fab exec "$b" -- timeout $((duration + 120)) "${env[@]}" "$bench" --rank 1 "${args[@]}" >"$out/$mode.$tag.rank1.out" 2>&1 &
  local p=$!
  fab exec "$a" -- timeout $((duration + 120)) "${env[@]}" "$bench" --rank 0 "${args[@]}" \
    -J "/tmp/contention-$mode-$tag.json" --label "$mode, job $tag" >"$out/$mode.$tag.rank0.out" 2>&1
  local rc=$?
  wait $p || rc=1
  fab exec "$a" -- cat "/tmp/contention-$mode-$tag.json" >"$out/$mode.$tag.json" 2>/dev/null
  if [ "$mode" != plain ]; then
    fab exec "$a" -- cat "/tmp/contention-$tag.json" >"$out/$mode.$tag.stats.json" 2>/dev/null
    fab exec "$a" -- cat "/tmp/contention-events-$tag.jsonl" >"$out/$mode.$tag.events.jsonl" 2>/dev/null
    fab exec "$b" -- cat "/tmp/contention-$tag.json" >"$out/$mode.$tag.stats1.json" 2>/dev/null
    fab exec "$b" -- cat "/tmp/contention-events-$tag.jsonl" >"$out/$mode.$tag.events1.jsonl" 2>/dev/null
    fab exec "$a" -- rm -f "/tmp/contention-$tag.json" "/tmp/contention-events-$tag.jsonl"
    fab exec "$b" -- rm -f "/tmp/contention-$tag.json" "/tmp/contention-events-$tag.jsonl"
  fi
  return $rc
}

# round MODE [solo]: both jobs at once; writes "MB/s of A, of B, spine 1 B,
# spine 2 B" to MODE.round. With solo, job A alone (tag S, B's MB/s nan):
# the same mode without contention, to MODE.solo.round.
round() {
  local mode=$1 solo=${2:-} port=$((30000 + RANDOM % 2000)) ja jb=
  local ta=A res="$out/$mode.round"
  [ -z "$solo" ] || ta=S res="$out/$mode.solo.round"
  fab counters --json >"$out/counters.a"
  job "$mode" $ta $ja_hosts $port & ja=$!
  [ -n "$solo" ] || { job "$mode" B $jb_hosts $((port + 1)) & jb=$!; }
  # halfway: what h1's agent's probes say of every path (source paths: the
  # shadows' own ports), for the record
  [ -n "$solo" ] || (sleep $((duration / 2 + 3)); fab exec h1 -- "$here/shuntctl" peers --json >"$out/$mode.peers-h1.json" 2>&1) &
  wait $ja || { echo "shunt-bench-contention: job $ta ($mode) failed"; cat "$out/$mode.$ta.rank0.out"; return 2; }
  [ -z "$jb" ] || wait $jb || { echo "shunt-bench-contention: job B ($mode) failed"; cat "$out/$mode.B.rank0.out"; return 2; }
  fab counters --json >"$out/counters.b"
  python3 - "$out" "$mode" "$ta" "$([ -n "$solo" ] || echo B)" <<'PY' >"$res"
import json, sys
out, mode, ta, tb = sys.argv[1:5]
def mbs(tag):
    if not tag:
        return float("nan")
    rows = [l.split() for l in open(f"{out}/{mode}.{tag}.rank0.out") if l.strip() and not l.startswith("#")]
    rows = [r for r in rows if len(r) == 9 and r[8] == "0"]
    return float(rows[-1][0]) / float(rows[-1][5]) if rows else float("nan")  # bytes / us per iteration
a, b = (json.load(open(f"{out}/counters.{x}"))["links"] for x in "ab")
up = [b[l]["up_bytes"] - a[l]["up_bytes"] for l in ("l1r0-s1", "l1r0-s2", "l2r0-s1", "l2r0-s2")]
print(mbs(ta), mbs(tb), *up)
PY
}

collided=
for ((i = 1; i <= tries; i++)); do
  round plain || exit 2
  read -r a b s1 s2 r1 r2 <"$out/plain.round"
  kind=apart
  [ $((s1 * 10)) -ge $(((s1 + s2) * 9)) ] || [ $((s2 * 10)) -ge $(((s1 + s2) * 9)) ] && kind=collided
  printf "  without libshunt, run %d: job A %.2f, job B %.2f MB/s; spine 1 %d MB, spine 2 %d MB: %s\n" \
    "$i" "$a" "$b" $((s1 / 1000000)) $((s2 / 1000000)) $kind
  for t in A B; do cp "$out/plain.$t.json" "$out/without-$i.$t.json" 2>/dev/null; done
  cp "$out/plain.round" "$out/without-$i.round"
  if [ $kind = collided ]; then collided=$i; break; fi
done
[ -n "$collided" ] || { echo "  (no colliding placement in $tries runs: the baseline is the last run)"; collided=$tries; }
cp "$out/without-$collided.round" "$out/without.round"
for t in A B; do cp "$out/without-$collided.$t.json" "$out/without.$t.json" 2>/dev/null; done

for mode in $modes; do
  round "$mode" || exit 2
  read -r a b s1 s2 r1 r2 <"$out/$mode.round"
  printf "  %s: job A %.2f, job B %.2f MB/s; leaf 1 -> spine 1 %d MB, spine 2 %d MB; leaf 2 -> spine 1 %d MB, spine 2 %d MB\n" \
    "$mode" "$a" "$b" $((s1 / 1000000)) $((s2 / 1000000)) $((r1 / 1000000)) $((r2 / 1000000))
done
# No contention: job A alone, static spreading and each steering mode, so
# steering is seen not to cost where nothing collides.
solo_modes=
[ $solo = 1 ] && for mode in $modes; do
  case $mode in static|latency|queue) solo_modes+="$mode " ;; esac
done
for mode in $solo_modes; do
  round "$mode" solo || exit 2
  read -r a _ s1 s2 r1 r2 <"$out/$mode.solo.round"
  printf "  %s, job A alone: %.2f MB/s; leaf 1 -> spine 1 %d MB, spine 2 %d MB; leaf 2 -> spine 1 %d MB, spine 2 %d MB\n" \
    "$mode" "$a" $((s1 / 1000000)) $((s2 / 1000000)) $((r1 / 1000000)) $((r2 / 1000000))
done

plots=()
for m in without $modes; do for t in A B; do [ -s "$out/$m.$t.json" ] && plots+=("$out/$m.$t.json"); done; done
"$bench" plot -o "$out/contention.png" --title "two all-to-all jobs on ${rate} Mbit/s spines" "${plots[@]}" \
  2>"$out/plot.err" || cat "$out/plot.err"

python3 - "$out" "$rate" "$duration" "$modes" "$solo_modes" <<'PY'
import glob, json, re, sys
out, rate, duration, modes, solo = sys.argv[1], float(sys.argv[2]), float(sys.argv[3]), sys.argv[4].split(), sys.argv[5].split()
# Max-min fair: both spines full each way, split evenly, so each job gets
# one spine's rate each way; a job's MB/s counts what both its ranks sent
# (size per iteration each way), so its fair share is twice a spine's rate.
# A spine's rate counts every byte of a frame (tbf counts the Ethernet
# header on), and of a RoCEv2 packet only the payload is a job's: with the
# path MTU the ranks report (rxe on a 1500-byte link: 1024) each packet
# carries 58 bytes more (Ethernet 14, IPv4 20, UDP 8, BTH 12, ICRC 4).
# Jobs are held to their fair share of payload; the wire figure is printed
# too.
mtus = set()
for f in glob.glob(f"{out}/*.rank0.out"):
    mtus.update(int(m) for m in re.findall(r" mtu (\d+) ", open(f).read()))
mtu = min(mtus) if mtus else 1024
payload = mtu / (mtu + 58)
wire_fair = 2 * rate / 8
fair = wire_fair * payload
ideal = 2 * fair
def rnd(m):
    a, b = open(f"{out}/{m}.round").read().split()[:2]
    return float(a), float(b)
def steering(m):
    steps = rev = n = 0
    for f in glob.glob(f"{out}/{m}.[AB].stats*.json"):  # the two jobs', not job A's alone
        for q in json.load(open(f))["verbs"]["qps"]:
            b = q.get("bundle")
            if b and b.get("paths"):
                steps += b.get("steer_steps", 0) + b.get("carrier_steers", 0); rev += b.get("steer_reversals", 0); n += 1
    return (steps / n / duration, rev / n / duration) if n else (0, 0)
base = sum(rnd("without"))
print(f"two jobs on {rate:g} Mbit/s spines, MB/s (max-min fair: {fair:.2f} each, {ideal:.2f} together, in payload: "
      f"{wire_fair:.2f} each at wire rate, {payload:.3f} of it in {mtu}-byte packets):")
print(f"  {'run':<10} {'job A':>7} {'job B':>7} {'sum':>7} {'vs without':>11} {'A/fair':>7} {'B/fair':>7} {'steps/s':>8} {'reversals/s':>12}")
for m in ["without"] + modes:
    a, b = rnd(m)
    st, rv = steering(m) if m != "without" else (0, 0)
    print(f"  {m:<10} {a:7.2f} {b:7.2f} {a + b:7.2f} {(a + b) / base:10.2f}x {a / fair:7.2f} {b / fair:7.2f} {st:8.2f} {rv:12.2f}")
for m in ("latency", "queue", "carrier"):
    if m not in modes:
        continue
    a, b = rnd(m)
    print(f"  targets, {m}: sum >= 1.3x without ({(a + b) / base:.2f}x); each job within 10% of its fair share "
          f"({a / fair:.2f}, {b / fair:.2f} of it)")
if solo:
    alone = {m: float(open(f"{out}/{m}.solo.round").read().split()[0]) for m in solo}
    print("no contention, job A alone, MB/s: " + ", ".join(f"{m} {alone[m]:.2f}" for m in solo) +
          f" (both spines at payload rate: {ideal:.2f})")
    if "static" in alone:
        for m in solo:
            if m != "static":
                print(f"  targets, {m}: no slower than static spreading alone (>= 0.98x): {alone[m] / alone['static']:.3f}x")
print(f"  plot: {out}/contention.png")
PY
