#!/usr/bin/env bash
# shunt-bench-scenario: one fault, the same workload without and with
# libshunt, side by side. Installed next to shunt-bench, which runs it for
# `shunt-bench scenario NAME`.
#
# Usage: shunt-bench scenario NAME [options]
#   NAME          link-down | port-down | flap | blackhole
#   --link L      the link to fault (default h1-r0, h1's own link on rail 0;
#                 e.g. l1r0-s1, its leaf's uplink to spine s1); port-down is
#                 always h1's port on rail 0
#   --transport T verbs (default) or tcp
#   --verb V      write_imm (default) or send
#   --ranks N     ranks, one guest each (default 2)
#   --size BYTES  message size (default 1M)
#   --duration S  seconds per run (default 40)
#   --fault-at S  seconds after rank 0's timeline starts (default 10)
#   --fault-for S seconds until the fault is healed (default 10)
#   --stall S     the benchmark's --stall-timeout (default 15)
#   --retry-cnt N --qp-timeout N   verbs QP retries and ACK timeout exponent
#                 (default 6 and 14: rxe treats 7 retries as "forever")
#   --out DIR     keep JSON, timelines, marks and the plot here (default ./scenario-NAME)
#   --keep        leave the fabric up afterwards (shunt-fabric --name NAME down)
# Exit: 0 when both runs were carried out (whatever they measured), 2 when
# the fabric or the harness failed, 77 when no fabric can be built here.
set -u
name=${1:-}
case $name in link-down|port-down|flap|blackhole) shift ;;
  *) sed -n '2,23p' "$0" | sed 's/^# \{0,1\}//'; exit 64 ;; esac
retry=6 qpto=14 transport=verbs verb=write_imm ranks=2 size=1M duration=40 fault_at=10 fault_for=10 stall=15 out= keep=0
link=h1-r0
while [ $# -gt 0 ]; do
  case $1 in
    --transport) transport=$2; shift ;;
    --link) link=$2; shift ;;
    --verb) verb=$2; shift ;;
    --ranks) ranks=$2; shift ;;
    --size) size=$2; shift ;;
    --duration) duration=$2; shift ;;
    --fault-at) fault_at=$2; shift ;;
    --fault-for) fault_for=$2; shift ;;
    --stall) stall=$2; shift ;;
    --retry-cnt) retry=$2; shift ;;
    --qp-timeout) qpto=$2; shift ;;
    --out) out=$2; shift ;;
    --keep) keep=1 ;;
    *) echo "shunt-bench-scenario: unknown option $1" >&2; exit 64 ;;
  esac
  shift
done

here=$(cd "$(dirname "$0")" && pwd)
bench=${SHUNT_BENCH:-$here/shunt-bench}
root=${SHUNT_ROOT:-$(cd "$here/../.." && pwd)}
fabric=$here/shunt-fabric
[ -x "$fabric" ] || fabric=$root/tools/shunt-fabric
shim=$root/${BUILD:-build}/lib/libshunt.so
[ -x "$fabric" ] || { echo "shunt-bench-scenario: shunt-fabric not found"; exit 77; }
[ -x "$bench" ] || { echo "shunt-bench-scenario: $bench not built"; exit 77; }
[ -f "$shim" ] || { echo "shunt-bench-scenario: $shim not built (make)"; exit 77; }
out=${out:-$PWD/scenario-$name}
mkdir -p "$out" && out=$(cd "$out" && pwd)
fab_name=sc$$
fab() { "$fabric" --name "$fab_name" "$@"; }
injector=
cleanup() {
  [ -n "$injector" ] && kill "$injector" 2>/dev/null && wait "$injector" 2>/dev/null
  [ $keep = 1 ] || fab down >/dev/null 2>&1
}
trap cleanup EXIT
trap 'exit 130' INT TERM

echo "scenario $name: $transport${transport:+ }$([ $transport = verbs ] && echo $verb), $ranks ranks, $size," \
  "fault on $([ $name = port-down ] && echo "h1's port on rail 0" || echo "$link") at ${fault_at}s for ${fault_for}s, ${duration}s per run"
fab up --hosts "$ranks" --rails 2 --spines 2 >"$out/fabric.log" 2>&1 ||
  { cat "$out/fabric.log"; echo "shunt-bench-scenario: cannot bring up the fabric"; exit 2; }
boot=$(fab addr h1 r1):29700  # the bootstrap rides rail 1: the fault is on rail 0

inject() {
  case $name:$1 in
    link-down:on) fab fault link-down "$link" ;;
    link-down:off) fab fault link-up "$link" ;;
    port-down:on) fab fault port-down h1 r0 ;;
    port-down:off) fab fault port-up h1 r0 ;;
    blackhole:on) fab fault blackhole "$link" ;;
    blackhole:off) fab fault unblackhole "$link" ;;
    flap:on) fab fault flap "$link" --period 1000 --count "$fault_for" ;;
    flap:off) ;;
  esac
}

# guest clock minus host clock, so fault marks land on the guests' timeline
clock_offset() {
  local a g b
  a=$(date +%s.%N); g=$(fab exec h1 -- date +%s.%N); b=$(date +%s.%N)
  python3 -c "print($g - ($a + $b) / 2)"
}

# run_one MODE: the workload on every guest, the fault injected meanwhile
run_one() {
  local mode=$1 r pids=() env=()
  # with: bundles need the job's key for the shims' peer channel (shunt-run
  # makes one per job)
  [ "$mode" = with ] && env=(-e "LD_PRELOAD=$shim" -e "SHUNT_MODE=active" -e "SHUNT_JOB_KEY=scenario-$fab_name-$RANDOM")
  local marks=$out/$mode.marks off
  off=$(clock_offset)
  : >"$marks"
  local args=(--world "$ranks" --bootstrap "$boot" --transport "$transport" --verb "$verb" -d rxe0
    -b "$size" -e "$size" -w 2 --duration "$duration" --timeline 100 -c 1 --stall-timeout "$stall" -q
    --seg 64K --retry-cnt "$retry" --qp-timeout "$qpto")  # small WRs: the timeline counts completions
  for ((r = ranks - 1; r >= 0; r--)); do
    local extra=()
    [ $transport = tcp ] && extra=(--addr "$(fab addr h$((r + 1)) r0)")
    if [ $r = 0 ]; then
      # guests see the host read-only: rank 0 writes into its own /tmp
      extra+=(-J "/tmp/shunt-bench-$mode.json" --label "$mode libshunt" --ready-file "/tmp/shunt-bench-$mode.ready")
      ( for _ in $(seq 600); do  # the fault clock starts with rank 0's timeline
          fab exec h1 -- test -e "/tmp/shunt-bench-$mode.ready" 2>/dev/null && break
          sleep 0.2
        done
        sleep "$fault_at"
        echo "@$(python3 -c "import time; print(time.time() + $off)"):$name" >>"$marks"; inject on
        sleep "$fault_for"
        echo "@$(python3 -c "import time; print(time.time() + $off)"):healed" >>"$marks"; inject off ) \
        >"$out/$mode.inject.log" 2>&1 &
      injector=$!
    fi
    fab exec "${env[@]}" h$((r + 1)) -- timeout $((duration + stall + 120)) "$bench" --rank $r "${args[@]}" "${extra[@]}" \
      >"$out/$mode.rank$r.out" 2>&1 &
    pids+=($!)
  done
  local rc=0 p
  for p in "${pids[@]}"; do wait "$p" || rc=$?; done
  wait "$injector" 2>/dev/null; injector=
  echo "$rc" >"$out/$mode.rc"
  fab exec h1 -- cat "/tmp/shunt-bench-$mode.json" >"$out/$mode.json" 2>/dev/null || rm -f "$out/$mode.json"
  # place the fault marks (guest epochs) on the run's own timeline
  [ -s "$out/$mode.json" ] && python3 - "$out/$mode.json" "$marks" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
start = j.get("timeline", {}).get("start_wall", 0)
for line in open(sys.argv[2]):
    t, _, label = line.strip().partition(":")
    if t.startswith("@"):
        j["marks"].append({"t": float(t[1:]) - start, "label": label})
json.dump(j, open(sys.argv[1], "w"), indent=1)
PY
}

for mode in without with; do
  echo "--- run $mode libshunt"
  run_one $mode
  inject off >/dev/null 2>&1  # healed whatever happened
  sleep 2
done

"$bench" plot -o "$out/$name.png" --title "$name on $([ $name = port-down ] && echo "h1 rail 0" || echo "$link"): without and with libshunt" \
  "$out/without.json" "$out/with.json" 2>"$out/plot.err" || cat "$out/plot.err"
python3 - "$out" "$name" <<'PY'
import json, os, sys
out, name = sys.argv[1], sys.argv[2]

def load(mode):
    r = {"mode": mode, "rc": "?", "json": None, "err": ""}
    try:
        r["rc"] = open(f"{out}/{mode}.rc").read().strip()
    except OSError:
        pass
    try:
        r["json"] = json.load(open(f"{out}/{mode}.json"))
    except (OSError, ValueError):
        pass
    errs = []
    for f in sorted(os.listdir(out)):
        if f.startswith(mode + ".rank"):
            errs += [l.strip() for l in open(os.path.join(out, f), errors="replace") if "error:" in l]
    # a transport's own error says more than a bootstrap that saw its peer go
    own = [e for e in errs if "bootstrap:" not in e]
    r["err"] = (own or errs or [""])[0]
    return r

def phases(j):
    s = [(x[1], x[3]) for x in j["timeline"]["samples"]]
    marks = {m["label"]: m["t"] for m in j["marks"]}
    fault = marks.get(name)
    healed = marks.get("healed")
    end = s[-1][0] if s else 0
    def mean(a, b):
        v = [g for t, g in s if a < t <= b]
        return sum(v) / len(v) if v else None
    res = {"end": end, "fault": fault, "healed": healed}
    if fault is None:
        return res
    res["before"] = mean(0.3, fault)
    res["during"] = mean(fault, healed if healed is not None else end)
    res["after"] = mean(healed, end) if healed is not None and end > healed else None
    base = res["before"] or 0
    # time to recover: from the fault until throughput is back to 90% of
    # what it was before, counted after the dip the fault caused (none: 0)
    res["recover"] = None
    if base:
        dip = next((t for t, g in s if t > fault and g < 0.9 * base), None)
        if dip is None:
            res["recover"] = 0.0
        else:
            res["recover"] = next((t - fault for t, g in s if t > dip and g >= 0.9 * base), None)
    longest = cur = 0.0
    prev = 0.0
    for t, g in s:
        cur = cur + (t - prev) if g == 0 else 0.0
        longest = max(longest, cur)
        prev = t
    res["stall"] = longest
    return res

runs = [load("without"), load("with")]
def fmt(v, unit="", nd=3):
    return "-" if v is None else f"{v:.{nd}f}{unit}"
rows = []
for r in runs:
    j = r["json"]
    p = phases(j) if j and "timeline" in j else {}
    col = {}
    col["exit status"] = r["rc"]
    if j:
        col["errors seen by the app"] = str(j["errors"])
        col["bytes wrong"] = "-" if j["wrong_total"] is None else str(j["wrong_total"])
    else:
        col["errors seen by the app"] = "no result"
        col["bytes wrong"] = "-"
    col["GB/s before the fault"] = fmt(p.get("before"))
    col["GB/s during the fault"] = fmt(p.get("during"))
    col["GB/s after healing"] = fmt(p.get("after"))
    if p.get("fault") is None:
        col["time to recover"] = "-"
    elif j.get("error"):
        col["time to recover"] = f"never (failed at {p['end']:.1f} s)"
    elif p.get("recover") is not None:
        col["time to recover"] = fmt(p["recover"], " s", 1)
    else:
        col["time to recover"] = f"never (run ended at {p['end']:.1f} s)"
    col["longest zero-throughput"] = fmt(p.get("stall"), " s", 1)
    rows.append(col)
print()
print(f"{'scenario ' + name:<26} {'without libshunt':<34} {'with libshunt':<34}")
for k in rows[0]:
    print(f"{k:<26} {rows[0][k]:<34} {rows[1][k]:<34}")
print(f"{'plot':<26} {out}/{name}.png")
for r in runs:
    print(f"first error {r['mode']} libshunt: {r['err'] or '-'}")
summary = {"scenario": name, "without": dict(rows[0], first_error=runs[0]["err"]),
           "with": dict(rows[1], first_error=runs[1]["err"])}
json.dump(summary, open(f"{out}/summary.json", "w"), indent=1)
PY
