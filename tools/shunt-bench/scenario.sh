#!/usr/bin/env bash
# shunt-bench-scenario: one fault, the same workload without and with
# libshunt, side by side. Installed next to shunt-bench, which runs it for
# `shunt-bench scenario NAME`.
#
# Usage: shunt-bench scenario NAME [options]
#   NAME          link-down | port-down | flap | blackhole | spine | two-rails |
#                 cascade | nic-remove | contention
#                 contention: two all-to-all jobs collide on rate-limited
#                 spines, run without libshunt, with static spreading and
#                 with steering (its own options: contention --help)
#                 link-down: LINK down (a host link goes silently dark; an
#                 uplink re-routes); port-down: h1's rail-0 port (carrier);
#                 flap: LINK down and up every --flap-ms; blackhole: LINK
#                 drops everything; spine: every link of --spine on rails 0
#                 and 1 drops everything; two-rails: h1's leaves on rails 0
#                 and 1 lose their uplinks to --spine at once; cascade: h1's
#                 rail-0 leaf loses its uplink to --spine, and 0.7 s later
#                 (a failover under way) the one to the other spine;
#                 nic-remove: h1's rail-0 NIC falls off the bus (for good)
#   --link L      the link to fault (default h1-r0, h1's own link on rail 0;
#                 e.g. l1r0-s1, its leaf's uplink to spine s1)
#   --spine S     the spine for spine, two-rails and cascade: s1, s2, or
#                 busy (default): in each run, the spine that carried most
#                 of h1's rail-0 bytes in the second before the fault, so
#                 the fault hits the route of a run without libshunt (its
#                 QP's port hashes to one spine; a fault on the other one
#                 would miss it)
#   --flap-ms MS  a down+up cycle of `flap` (default 1000)
#   --client C    alltoall (default) or sendrecv: shunt-bench with that
#                 pattern (-c 1); ib_write_bw, ib_send_bw (perftest, h1 to
#                 h2, rdma_cm with --retry-cnt, for --duration), fi_pingpong
#                 (libfabric verbs, 4 KiB round trips, --pings of them):
#                 unchanged programs, judged by their exit status and
#                 what they print (they check no data)
#   --pings N     fi_pingpong's round trips (default 4000)
#   --transport T verbs (default) or tcp
#   --verb V      write_imm (default) or send
#   --ranks N     ranks, one guest each (default 2)
#   --size BYTES  message size (default 1M)
#   --duration S  seconds per run (default 40)
#   --fault-at S  seconds after rank 0's timeline starts (default 10); for
#                 the unchanged programs, after the client's QP is up
#   --fault-for S seconds until the fault is healed (default 10; 0: never,
#                 the fault is for good)
#   --stall S     the benchmark's --stall-timeout (default 15); an unchanged
#                 program run without libshunt that gets no byte for S s
#                 after a fault for good is ended and called hung (exit 124)
#   --retry-cnt N --qp-timeout N   verbs QP retries and ACK timeout exponent
#                 (default 6 and 18, about 1 s a try: rxe treats 7 retries
#                 as "forever", and with 14 four guests on two host cores
#                 timed out with no fault at all)
#   --out DIR     keep JSON, timelines, marks and the plot here (default ./scenario-NAME)
#   --no-probes   the run with libshunt probes nothing (SHUNT_PROBE_ADDRS=none),
#                 for comparison. By default it probes every path, the
#                 application's QPs' own included, as libshunt does with
#                 no SHUNT_* set: each host's first process becomes its
#                 agent with a probe engine on the rails it finds behind
#                 the host's RoCE ports; a path whose probes are lost fails
#                 within SHUNT_PATH_DEAD_MS, before any retransmission;
#                 the fabric's ECMP then hashes on addresses and source
#                 port (shunt-fabric up --ecmp-hash sport), so a probe takes
#                 the route of the QP whose source port it leaves from
#   --probes      the default, kept for old command lines
#   --keep        leave the fabric up afterwards (shunt-fabric --name NAME down)
# Environment: libshunt's SHUNT_* settings (not SHUNT_FABRIC_*) go to the
# run with libshunt, e.g. SHUNT_STALL_MS=1000 shunt-bench scenario ...
# Exit: 0 when both runs were carried out (whatever they measured), 2 when
# the fabric or the harness failed, 77 when no fabric can be built here.
set -u
name=${1:-}
if [ "$name" = contention ]; then
  shift
  exec "$(dirname "$0")/shunt-bench-contention" "$@"
fi
# The tools next to this script: a build tree's build/bin (libshunt in
# build/lib) or PREFIX/bin (libshunt in PREFIX/lib/shunt); SHUNT_ROOT or
# BUILD name a checkout's build instead.
here=$(cd "$(dirname "$0")" && pwd)
bench=${SHUNT_BENCH:-$here/shunt-bench}
fabric=$here/shunt-fabric
# the side-by-side report: installed next to this script, or its source
# next to scenario.sh in a checkout
report=$here/shunt-bench-scenario-report
[ -f "$report" ] || report=$here/scenario_report.py
if [ -n "${SHUNT_ROOT:-}${BUILD:-}" ]; then
  root=${SHUNT_ROOT:-$(cd "$here/../.." && pwd)}
  [ -x "$fabric" ] || fabric=$root/tools/shunt-fabric
  case ${BUILD:-build} in /*) shim=$BUILD/lib/libshunt.so ;; *) shim=$root/${BUILD:-build}/lib/libshunt.so ;; esac
else
  shim=$here/../lib/libshunt.so
  [ -f "$shim" ] || shim=$here/../lib/shunt/libshunt.so
fi
usage() {
  sed -n '2,65p' "$0" | sed 's/^# \{0,1\}//'
  echo "Uses: $bench, $fabric, $shim"
}
case $name in link-down|port-down|flap|blackhole|spine|two-rails|cascade|nic-remove) shift ;;
  -h|--help) usage; exit 0 ;;
  *) usage; exit 64 ;; esac
# libshunt's settings in the caller's environment (SHUNT_*, not the
# fabric's own SHUNT_FABRIC_* nor the tools' SHUNT_BENCH*, SHUNT_ROOT) go
# to the run with libshunt in the guests (libshunt warns of unknown ones)
passed=()
while IFS= read -r v; do
  case $v in SHUNT_FABRIC_*|SHUNT_BENCH|SHUNT_BENCH_*|SHUNT_ROOT) ;; SHUNT_*) passed+=("$v=${!v}") ;; esac
done < <(compgen -e)
retry=6 qpto=18 transport=verbs verb=write_imm ranks=2 size=1M duration=40 fault_at=10 fault_for=10 stall=15 out= keep=0
client=alltoall pings=4000 probes=1
link=h1-r0 spine=busy flap_ms=1000
[ $name = nic-remove ] && fault_for=0
while [ $# -gt 0 ]; do
  case $1 in
    --transport) transport=$2; shift ;;
    --client) client=$2; shift ;;
    --pings) pings=$2; shift ;;
    --link) link=$2; shift ;;
    --spine) spine=$2; shift ;;
    --flap-ms) flap_ms=$2; shift ;;
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
    --probes) probes=1 ;;
    --no-probes) probes=0 ;;
    *) echo "shunt-bench-scenario: unknown option $1" >&2; exit 64 ;;
  esac
  shift
done

case $spine in s[0-9]*|busy) ;; *) echo "shunt-bench-scenario: --spine: s1, s2, ... or busy, not $spine" >&2; exit 64 ;; esac
case $client in
  alltoall|sendrecv) ;;
  ib_write_bw|ib_send_bw|fi_pingpong) ranks=2 transport=verbs ;;
  *) echo "shunt-bench-scenario: --client: alltoall, sendrecv, ib_write_bw, ib_send_bw or fi_pingpong, not $client" >&2; exit 64 ;;
esac

[ -x "$fabric" ] || { echo "shunt-bench-scenario: shunt-fabric not found"; exit 77; }
[ -x "$bench" ] || { echo "shunt-bench-scenario: $bench not built"; exit 77; }
[ -f "$shim" ] || { echo "shunt-bench-scenario: $shim not built (make)"; exit 77; }
[ -f "$report" ] || { echo "shunt-bench-scenario: $report not found"; exit 77; }
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

spine_is=$spine
[ "$spine" = busy ] && spine_is="busy (the one h1's rail-0 traffic crossed just before)"
case $name in
  port-down) where="h1's port on rail 0" ;;
  nic-remove) where="h1's NIC on rail 0" ;;
  spine) where="every link of spine $spine_is on rails 0 and 1" ;;
  two-rails) where="h1's leaves' uplinks to spine $spine_is on rails 0 and 1" ;;
  cascade) where="h1's rail-0 uplink to spine $spine_is, then to the other spine" ;;
  flap) where="$link every ${flap_ms} ms" ;;
  *) where=$link ;;
esac
what="$transport${transport:+ }$([ $transport = verbs ] && echo $verb) $client, $ranks ranks, $size"
case $client in
  ib_*) what="$client (perftest, h1 to h2, rdma_cm, retry count $retry), $size" ;;
  fi_pingpong) what="fi_pingpong (libfabric verbs, h1 to h2), $pings round trips of 4 KiB" ;;
esac
echo "scenario $name: $what," \
  "fault on $where at ${fault_at}s $([ "$fault_for" = 0 ] && echo "for good" || echo "for ${fault_for}s"), ${duration}s per run"
# The benchmark's bootstrap (TCP, a round trip every 20 ms) rides the last
# rail, which no fault touches: rail 1, or a third rail where the fault
# also hits rail 1 (a TCP stall there would stall both runs alike).
rails=2
case $name in spine|two-rails) rails=3 ;; esac
# Probes follow a QP's route only where ECMP ignores the destination port
# (they go to the peer's probe port, the QP's packets to 4791): unless
# --no-probes, the fabric's routers hash on addresses and source port, in both
# runs alike (for RoCE, whose destination port never varies, the spread of
# flows over the spines is the same either way).
hashing=()
[ $probes = 1 ] && hashing=(--ecmp-hash sport)
fab up --hosts "$ranks" --rails $rails --spines 2 "${hashing[@]}" >"$out/fabric.log" 2>&1 ||
  { cat "$out/fabric.log"; echo "shunt-bench-scenario: cannot bring up the fabric"; exit 2; }
boot=$(fab addr h1 r$((rails - 1))):29700

# probe_env MODE HOST: what the host's run adds to its environment: the
# defaults find the rails and probe them; --no-probes turns that off
probe_env() {
  [ "$1" = with ] && [ $probes = 0 ] && echo "SHUNT_PROBE_ADDRS=none"
  return 0
}

# the spine a run's fault is on: --spine, or the busy one picked for the run
spine_file=$out/spine.now
faulted_spine() { cat "$spine_file" 2>/dev/null || echo s1; }
other_spine() { [ "$(faulted_spine)" = s1 ] && echo s2 || echo s1; }
# pick_spine: --spine busy waits a second and picks the spine whose uplinks
# from h1's rail-0 leaf carried the most bytes meanwhile (both directions)
pick_spine() {
  case $name in spine|two-rails|cascade) ;; *) return 0 ;; esac
  [ "$spine" != busy ] && { echo "$spine" >"$spine_file"; return 0; }
  local a b
  a=$(fab counters --json); sleep 1; b=$(fab counters --json)
  python3 -c '
import json, re, sys
a, b = json.loads(sys.argv[1])["links"], json.loads(sys.argv[2])["links"]
d = {}
for k, v in b.items():
    m = re.fullmatch(r"l1r0-(s\d+)", k)
    if m and v and a.get(k):
        d[m.group(1)] = v["up_bytes"] + v["down_bytes"] - a[k]["up_bytes"] - a[k]["down_bytes"]
print(max(sorted(d), key=lambda s: d[s]) if d else "s1")
print("bytes in the second before the fault, h1 rail-0 leaf to each spine:", d, file=sys.stderr)
' "$a" "$b" >"$spine_file"
  echo "fault on spine $(faulted_spine)"
}

# the spine's links on rails 0 and 1 (not the bootstrap's rail)
spine_links() { fab links --json | python3 -c "import json,re,sys; print(' '.join(k for k in json.load(sys.stdin) if re.match(r'l\d+r[01]-$(faulted_spine)\$', k)))"; }

inject() {
  local l s o
  s=$(faulted_spine) o=$(other_spine)
  case $name:$1 in
    link-down:on) fab fault link-down "$link" ;;
    link-down:off) fab fault link-up "$link" ;;
    port-down:on) fab fault port-down h1 r0 ;;
    port-down:off) fab fault port-up h1 r0 ;;
    blackhole:on) fab fault blackhole "$link" ;;
    blackhole:off) fab fault unblackhole "$link" ;;
    flap:on) fab fault flap "$link" --period "$flap_ms" --count $((fault_for * 1000 / flap_ms)) & ;;
    flap:off) wait; fab fault link-up "$link" ;;
    spine:on) for l in $(spine_links); do fab fault blackhole "$l"; done ;;
    spine:off) for l in $(spine_links); do fab fault unblackhole "$l"; done ;;
    two-rails:on) fab fault blackhole "l1r0-$s"; fab fault blackhole "l1r1-$s" ;;
    two-rails:off) fab fault unblackhole "l1r0-$s"; fab fault unblackhole "l1r1-$s" ;;
    cascade:on) fab fault blackhole "l1r0-$s"; sleep 0.7; fab fault blackhole "l1r0-$o" ;;
    cascade:off) fab fault unblackhole "l1r0-$s"; fab fault unblackhole "l1r0-$o" ;;
    nic-remove:on) fab fault nic-remove h1 r0 ;;
    nic-remove:off) ;;
  esac
}

# guest clock minus host clock, so fault marks land on the guests' timeline
clock_offset() {
  local a g b
  a=$(date +%s.%N); g=$(fab exec h1 -- date +%s.%N); b=$(date +%s.%N)
  python3 -c "print($g - ($a + $b) / 2)"
}

# connected PROG: waits (up to 60 s) until PROG on h1 has an RC QP in RTS,
# asking the guest's rdma tool every half second. (A loop in the guest that
# parsed its JSON with python3 saw the QP 4-18 s late while the guest's CPU
# was busy with soft-RoCE: the fault of a 20 s ib_write_bw run then came at
# its end, and the run with libshunt had no fault to survive.)
connected() {
  local t0=$SECONDS n=0 qps
  while [ $((SECONDS - t0)) -lt 60 ]; do
    n=$((n + 1))
    qps=$(fab exec h1 -- rdma resource show qp 2>/dev/null)
    if grep -qE "type RC .*state RTS .*comm $1( |\$)" <<<"$qps"; then
      echo "$1 connected ($(date +%T.%N), check $n)"
      return 0
    fi
    sleep 0.5
  done
  echo "$1 did not connect within 60 s: the fault comes anyway"
  echo "$qps"
}

# the fault's marks (guest epochs): from when the workload starts
fault_clock() {  # MODE OFFSET
  local marks=$out/$1.marks
  case $spine:$name in
    busy:spine|busy:two-rails|busy:cascade)  # the pick takes the last second
      sleep "$(python3 -c "print(max(0.0, $fault_at - 1))")"; pick_spine ;;
    *) sleep "$fault_at"; pick_spine ;;
  esac
  echo "@$(python3 -c "import time; print(time.time() + $2)"):$name" >>"$marks"; inject on
  if [ "$fault_for" != 0 ]; then
    sleep "$fault_for"
    echo "@$(python3 -c "import time; print(time.time() + $2)"):healed" >>"$marks"; inject off
  fi
}

# kill_job PID: a background job of this script, and the exec client it
# runs: a function's job is a subshell, the client its child, and only the
# client's end ends the program in the guest (ended alone, the subshell
# left a program running there into the next run)
kill_job() {
  local c
  for c in $(ps -o pid= --ppid "$1" 2>/dev/null); do kill "$c" 2>/dev/null; done
  kill "$1" 2>/dev/null
}

# h1_bytes_in: bytes the fabric delivered to h1, all rails
h1_bytes_in() {
  fab counters --json | python3 -c 'import json, sys
print(sum(v["down_bytes"] for k, v in json.load(sys.stdin)["links"].items() if v and k.startswith("h1-")))'
}

# hung_watch CLIENT_PID MODE: once the fault is in, a client to which no
# byte has come for --stall seconds is ended and the run called hung (exit
# 124, as its time limit would have), like the benchmark's own stall
# timeout; it would otherwise wait out that limit (fi_pingpong over a dead
# link: --duration, --stall and 30 s)
hung_watch() {
  local cli=$1 mode=$2 last= now quiet=0
  until grep -q ":$name\$" "$out/$mode.marks" 2>/dev/null; do
    kill -0 "$cli" 2>/dev/null || return 0
    sleep 0.5
  done
  while kill -0 "$cli" 2>/dev/null; do
    now=$(h1_bytes_in) || now=
    if [ -n "$now" ] && [ "$now" = "$last" ]; then quiet=$((quiet + 1)); else quiet=0; last=$now; fi
    if [ $quiet -ge "$stall" ]; then
      echo "no byte reached h1 for $stall s after the fault: the run is called hung" | tee "$out/$mode.hung"
      kill_job "$cli"
      return 0
    fi
    sleep 1
  done
}

# run_tool MODE: an unchanged verbs program, server on h2, client on h1
run_tool() {
  local mode=$1 env=(env) off srv cli
  [ "$mode" = with ] && env=(env "${passed[@]}" "LD_PRELOAD=$shim" "SHUNT_MODE=active" "SHUNT_JOB_KEY=scenario-$fab_name-$RANDOM"
    "SHUNT_STATS_FILE=/tmp/shunt-stats.json" "SHUNT_EVENT_LOG=/tmp/shunt-events.jsonl")
  off=$(clock_offset)
  : >"$out/$mode.marks"
  local dst args port
  dst=$(fab addr h2 r0)
  case $client in
    ib_*) port=18515
      args=("$client" -d rxe0 -R --retry_count="$retry" -u "$qpto" -D "$duration" -s "$(numfmt --from=iec "$size")") ;;
    fi_pingpong) port=47592
      args=(fi_pingpong -p verbs -e msg -I "$pings" -S 4096) ;;
  esac
  # bounded like the benchmark's runs: a program that hangs on a dead
  # connection ends with exit 124
  fab exec h2 -- timeout $((duration + stall + 30)) "${env[@]}" $(probe_env "$mode" h2) "${args[@]}" >"$out/$mode.server.out" 2>&1 &
  srv=$!
  # listening: a TCP socket (fi_pingpong's control connection) or an
  # rdma_cm id (perftest -R)
  fab wait-port h2 "$port"
  fab exec h1 -- timeout $((duration + stall + 30)) "${env[@]}" $(probe_env "$mode" h1) "${args[@]}" "$dst" >"$out/$mode.client.out" 2>&1 &
  cli=$!
  local t0
  t0=$(date +%s.%N)
  # the fault clock starts once the program's connection is up (a QP of
  # its own in RTS on h1): on a slow host its set-up alone can outlast
  # --fault-at, and a fault then would test connecting, not failing over
  ( connected "${args[0]}" && fault_clock "$mode" "$off" ) >"$out/$mode.inject.log" 2>&1 &
  injector=$!
  # without libshunt, a fault for good may leave the program waiting on a
  # dead connection: called hung after --stall seconds without a byte
  local watch=
  rm -f "$out/$mode.hung"
  if [ "$mode" = without ] && [ "$fault_for" = 0 ]; then
    hung_watch "$cli" "$mode" &
    watch=$!
  fi
  local rc=0
  wait "$cli" || rc=$?
  [ -e "$out/$mode.hung" ] && rc=124
  [ -n "$watch" ] && { kill "$watch" 2>/dev/null; wait "$watch" 2>/dev/null; }
  python3 -c "import time; print(round(time.time() - $t0, 1))" >"$out/$mode.ran"
  # a client that failed decided the run; its server, whose peer vanished
  # over a dead link, would wait out its time limit: 5 s, then it is ended
  # (the exec's end ends the program in the guest)
  if [ $rc != 0 ]; then
    for _ in $(seq 25); do kill -0 "$srv" 2>/dev/null || break; sleep 0.2; done
    kill_job "$srv"
  fi
  wait "$srv" || { [ $rc = 0 ] && rc=$?; }
  wait "$injector" 2>/dev/null; injector=
  echo "$rc" >"$out/$mode.rc"
  if [ "$mode" = with ]; then
    for r in 0 1; do
      fab exec h$((r + 1)) -- cat /tmp/shunt-stats.json >"$out/with.stats$r.json" 2>/dev/null
      fab exec h$((r + 1)) -- cat /tmp/shunt-events.jsonl >"$out/with.events$r.jsonl" 2>/dev/null
    done
  fi
}

# run_one MODE: the workload on every guest, the fault injected meanwhile
run_one() {
  local mode=$1 r pids=() env=(env)
  # with: bundles need the job's key for the shims' peer channel (shunt-run
  # makes one per job)
  # (set for the benchmark itself: `timeout` preloaded would write the
  # stats file too, at its own exit, after the benchmark's)
  [ "$mode" = with ] && env=(env "${passed[@]}" "LD_PRELOAD=$shim" "SHUNT_MODE=active" "SHUNT_JOB_KEY=scenario-$fab_name-$RANDOM"
    "SHUNT_STATS_FILE=/tmp/shunt-stats.json" "SHUNT_EVENT_LOG=/tmp/shunt-events.jsonl")
  local marks=$out/$mode.marks off
  off=$(clock_offset)
  : >"$marks"
  local args=(--world "$ranks" --bootstrap "$boot" -p "$client" --transport "$transport" --verb "$verb" -d rxe0
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
        fault_clock "$mode" "$off" ) \
        >"$out/$mode.inject.log" 2>&1 &
      injector=$!
    fi
    fab exec h$((r + 1)) -- timeout $((duration + stall + 120)) "${env[@]}" $(probe_env "$mode" h$((r + 1))) \
      "$bench" --rank $r "${args[@]}" "${extra[@]}" \
      >"$out/$mode.rank$r.out" 2>&1 &
    pids+=($!)
  done
  local rc=0 p
  for p in "${pids[@]}"; do wait "$p" || rc=$?; done
  wait "$injector" 2>/dev/null; injector=
  echo "$rc" >"$out/$mode.rc"
  fab exec h1 -- cat "/tmp/shunt-bench-$mode.json" >"$out/$mode.json" 2>/dev/null || rm -f "$out/$mode.json"
  if [ "$mode" = with ]; then  # what shunt did: every rank's stats and event log
    for ((r = 0; r < ranks; r++)); do
      fab exec h$((r + 1)) -- cat /tmp/shunt-stats.json >"$out/with.stats$r.json" 2>/dev/null
      fab exec h$((r + 1)) -- cat /tmp/shunt-events.jsonl >"$out/with.events$r.jsonl" 2>/dev/null
    done
  fi
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
  rm -f "$spine_file"
  case $client in
    alltoall|sendrecv) run_one $mode ;;
    *) run_tool $mode ;;
  esac
  inject off >/dev/null 2>&1  # healed whatever happened
  [ -e "$spine_file" ] && mv "$spine_file" "$out/$mode.spine"
  if [ $name = nic-remove ] && [ $mode = without ]; then  # for good: a fresh fabric for the next run
    fab down >/dev/null 2>&1
    fab up --hosts "$ranks" --rails $rails --spines 2 "${hashing[@]}" >"$out/fabric.log" 2>&1 ||
      { cat "$out/fabric.log"; echo "shunt-bench-scenario: cannot bring up the fabric again"; exit 2; }
  fi
  sleep 2
done

if [ -s "$out/with.json" ]; then
  "$bench" plot -o "$out/$name.png" --title "$name on $where: without and with libshunt" \
    "$out/without.json" "$out/with.json" 2>"$out/plot.err" || cat "$out/plot.err"
fi
python3 "$report" "$out" "$name" "$client"
