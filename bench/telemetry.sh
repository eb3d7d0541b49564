#!/usr/bin/env bash
# What telemetry costs an application: busbw of a 4-rank tcp alltoall on
# loopback under libshunt (observe mode), without and with telemetry on
# (the /metrics endpoint scraped every 100 ms, the textfile rewritten every
# 100 ms, the event log, reports every 100 ms), runs interleaved so load
# from elsewhere hits both alike; the median of REPS runs each, side by
# side, and the difference. Figures only, never pass/fail.
# Usage: bench/telemetry.sh [REPS]   (default 9)
set -u
cd "$(dirname "$0")/.."
B=${BUILD:-build}
BENCH=$B/bin/shunt-bench LIB=$B/lib/libshunt.so
REPS=${1:-9}
[ -x "$BENCH" ] && [ -f "$LIB" ] || { echo "build first: make all"; exit 1; }
WORK=$(mktemp -d /tmp/shunt-bench-telemetry.XXXXXX)
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; done; rm -rf "$WORK"; }
trap cleanup EXIT
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# run_once MODE -> prints the average busbw (GB/s)
run_once() {
  local mode=$1 port; port=$(free_port)
  local run=$WORK/$mode-$RANDOM; mkdir -p "$run"
  local env=(SHUNT_MODE=observe SHUNT_RUN_DIR=$run SHUNT_METRICS_ADDR=off SHUNT_REPORT_INTERVAL_MS=1000)
  local pre=(env LD_PRELOAD=$LIB)
  local scraper=
  case $mode in
    none) pre=(env) ;;
    off) ;;
    on)
      local mport; mport=$(free_port)
      env=(SHUNT_MODE=observe SHUNT_RUN_DIR=$run SHUNT_METRICS_ADDR=127.0.0.1:$mport SHUNT_REPORT_INTERVAL_MS=100
           SHUNT_METRICS_TEXTFILE=$run/m.prom SHUNT_METRICS_INTERVAL_MS=100 SHUNT_EVENT_LOG=$run/ev-%p.log)
      python3 - "$mport" "$WORK/scrape-ms" <<'PY' &
import sys, time, urllib.request
end = time.time() + 120
while time.time() < end:
    t = time.perf_counter()
    try:
        body = urllib.request.urlopen("http://127.0.0.1:%s/metrics" % sys.argv[1], timeout=1).read()
        if b"shunt_socket_tx_bytes_total{" in body:
            with open(sys.argv[2], "a") as f: f.write("%.3f\n" % ((time.perf_counter() - t) * 1e3))
    except Exception: pass
    time.sleep(0.1)
PY
      scraper=$!; PIDS+=($scraper) ;;
  esac
  local r pids=()
  for r in 1 2 3; do
    "${pre[@]}" "${env[@]}" timeout 120 "$BENCH" --rank $r --world 4 --bootstrap 127.0.0.1:$port \
      --transport tcp -b 1M -e 16M -f 2 -n 20 -w 5 -c 0 > "$WORK/r$r.log" 2>&1 & pids+=($!)
  done
  "${pre[@]}" "${env[@]}" timeout 120 "$BENCH" --rank 0 --world 4 --bootstrap 127.0.0.1:$port \
    --transport tcp -b 1M -e 16M -f 2 -n 20 -w 5 -c 0 > "$WORK/r0.log" 2>&1
  for p in "${pids[@]}"; do wait "$p"; done
  [ -n "$scraper" ] && kill "$scraper" 2>/dev/null
  sed -n 's/^# Avg bus bandwidth *: *//p' "$WORK/r0.log"
}

declare -A runs
for i in $(seq "$REPS"); do
  for mode in none off on; do runs[$mode]="${runs[$mode]:-} $(run_once $mode)"; done
done
python3 - "${runs[none]}" "${runs[off]}" "${runs[on]}" "$WORK/scrape-ms" <<'PY'
import os, statistics, sys
none, off, on = ([float(x) for x in a.split()] for a in sys.argv[1:4])
scr = [float(x) for x in open(sys.argv[4])] if os.path.exists(sys.argv[4]) else []
med = lambda v: statistics.median(v) if v else float("nan")
print("4-rank tcp alltoall on loopback, 1M..16M, avg busbw GB/s, %d runs each (interleaved)" % len(off))
print("%-34s %8s   %s" % ("", "median", "runs"))
for name, v in (("no libshunt", none), ("libshunt observe, telemetry off", off), ("libshunt observe, telemetry on", on)):
    print("%-34s %8.3f   %s" % (name, med(v), " ".join("%.3f" % x for x in v)))
if off and on:
    d = (med(on) - med(off)) / med(off) * 100
    pairs = [b / a for a, b in zip(off, on) if a > 0]
    print("telemetry cost: %+.2f%% busbw by medians, %+.2f%% by the median of paired runs (budget: -1%%)"
          % (d, (statistics.median(pairs) - 1) * 100))
    spread = (max(off) - min(off)) / med(off) * 100
    print("run-to-run spread with telemetry off: %.0f%% of the median (noise floor of this machine)" % spread)
if scr:
    print("scrape of /metrics during traffic: median %.2f ms, max %.2f ms over %d scrapes"
          " (agent-side work, every 100 ms here: %.1f%% of one core at most)"
          % (med(scr), max(scr), len(scr), med(scr) / 100 * 100))
PY
