#!/usr/bin/env bash
# How long a scrape of /metrics takes while N connections to the endpoint
# stay open and silent (N = 0, 4, 64, 300): median and max of 5 scrapes
# each, from one agent (hold_socket) on loopback, a scrape given 10 s (as
# Prometheus gives it by default). Figures only.
# Usage: bench/metrics-idle.sh   (BUILD=... for another build)
set -u
cd "$(dirname "$0")/.."
B=${BUILD:-build}
case $B in /*) ;; *) B=$PWD/$B ;; esac
[ -f "$B/lib/libshunt.so" ] && [ -x "$B/test/hold_socket" ] || { echo "build first: make all build/test/unit_tests"; exit 1; }
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
run=$(mktemp -d /tmp/shunt-bench-idle.XXXXXX)
SHUNT_RUN_DIR=$run SHUNT_METRICS_ADDR=127.0.0.1:$port LD_PRELOAD=$B/lib/libshunt.so "$B/test/hold_socket" 120000 & agent=$!
trap 'kill $agent 2>/dev/null; rm -rf "$run"' EXIT
python3 - "$port" <<'PY'
import socket, statistics, sys, time, urllib.request
port = int(sys.argv[1])
url = "http://127.0.0.1:%d/metrics" % port
for i in range(50):
    try:
        urllib.request.urlopen(url, timeout=5).read()
        break
    except OSError:
        time.sleep(0.1)
for n in (0, 4, 64, 300):
    idle = [socket.create_connection(("127.0.0.1", port)) for _ in range(n)]
    time.sleep(0.2)
    t, failed = [], 0
    for i in range(5):
        t0 = time.monotonic()
        try:
            body = urllib.request.urlopen(url, timeout=10).read()
            assert b"shunt_build_info" in body, "not a scrape"
            t.append((time.monotonic() - t0) * 1000)
        except OSError:
            failed += 1
    line = "%3d idle connections: %d of 5 scrapes answered" % (n, len(t))
    if t:
        line += ", median %.1f ms, max %.1f ms" % (statistics.median(t), max(t))
    print(line, flush=True)
    for s in idle:
        s.close()
PY
