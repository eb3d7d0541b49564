#!/usr/bin/env bash
# Debian's Prometheus scrapes two hosts' agents (network namespaces joined
# by a veth pair, probing each other, a TCP connection of one job between
# them): the job's id is under shunt_job (not renamed exported_job), no
# series names a pid, QP or port, one-way delays are a histogram, and every
# panel's query of examples/grafana-shunt.json returns data through the
# HTTP API (or names only metrics these hosts have no samples of: no RDMA).
# timeout: 120
. "$(dirname "$0")/../lib.sh"
[ "$(id -u)" = 0 ] || skip "needs root (network namespaces)"
command -v prometheus >/dev/null || skip "no prometheus (make deps)"
NA=tpa$$ NB=tpb$$
veth_pair $NA $NB

common="SHUNT_JOB_KEY=prom-$$ SHUNT_MODE=observe SHUNT_REPORT_INTERVAL_MS=200 SHUNT_PROBE_INTERVAL_MS=20 SHUNT_CLOCK_SHM=/shunt-test-$$-%h"
mkdir -p "$TMP/ra" "$TMP/rb"
# The agents: A serves ":9471" (every address), B its own address.
ip netns exec $NA env $common SHUNT_RUN_DIR=$TMP/ra SHUNT_PROBE_NAME=a SHUNT_METRICS_ADDR=:9471 \
  SHUNT_PROBE_ADDRS=10.99.0.1 SHUNT_PEERS=b=10.99.0.2 LD_PRELOAD=$LIB "$B/test/hold_socket" 100000 & pa=$!
ip netns exec $NB env $common SHUNT_RUN_DIR=$TMP/rb SHUNT_PROBE_NAME=b SHUNT_METRICS_ADDR=10.99.0.2:9471 \
  SHUNT_PROBE_ADDRS=10.99.0.2 SHUNT_PEERS=a=10.99.0.1 LD_PRELOAD=$LIB "$B/test/hold_socket" 100000 & pb=$!
at_exit "kill $pa $pb 2>/dev/null; wait $pa $pb 2>/dev/null"
sleep 0.5
# One job's ranks 0 and 1, a connection from A to B at ~1 MB/s.
port=$(free_port)
ip netns exec $NB env $common SHUNT_RUN_DIR=$TMP/rb SHUNT_JOB_ID=job-55 RANK=1 LD_PRELOAD=$LIB /usr/bin/python3 -c '
import socket, sys
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("10.99.0.2", int(sys.argv[1]))); s.listen(1); c, _ = s.accept()
while c.recv(1 << 16): pass' "$port" & sink=$!
ip netns exec $NA env $common SHUNT_RUN_DIR=$TMP/ra SHUNT_JOB_ID=job-55 RANK=0 LD_PRELOAD=$LIB /usr/bin/python3 -c '
import socket, sys, time
for i in range(50):
    try:
        s = socket.create_connection(("10.99.0.2", int(sys.argv[1]))); break
    except OSError: time.sleep(0.1)
end = time.time() + 90
while time.time() < end:
    s.sendall(b"x" * 10000); time.sleep(0.01)' "$port" & send=$!
at_exit "kill $sink $send 2>/dev/null"

pport=$(free_port)
cat > "$TMP/prom.yml" <<YML
global: {scrape_interval: 1s, evaluation_interval: 1s}
scrape_configs:
  - job_name: shunt
    static_configs: [{targets: ["10.99.0.1:9471", "10.99.0.2:9471"]}]
YML
ip netns exec $NA prometheus --config.file="$TMP/prom.yml" --storage.tsdb.path="$TMP/tsdb" \
  --web.listen-address=127.0.0.1:$pport --log.level=warn > "$TMP/prom.log" 2>&1 & prom=$!
at_exit "kill $prom 2>/dev/null; wait $prom 2>/dev/null"

ip netns exec $NA python3 - "http://127.0.0.1:$pport" "$ROOT/examples/grafana-shunt.json" <<'PY' || fail "$(tail -n 5 "$TMP/prom.log")"
import json, re, sys, time, urllib.parse, urllib.request
base, dash = sys.argv[1], sys.argv[2]
def api(path, **q):
    url = base + path + ("?" + urllib.parse.urlencode(q) if q else "")
    d = json.load(urllib.request.urlopen(url, timeout=10))
    assert d["status"] == "success", (url, d)
    return d["data"]
def query(e): return api("/api/v1/query", query=e)["result"]
def fail(why): print("FAIL:", why); sys.exit(1)
# Until both agents were scraped with probe delays and the job's bytes, then
# long enough for the dashboard's rate() windows to hold several samples.
end = time.time() + 60
while time.time() < end:
    try:
        up = query('up{job="shunt"} == 1')
        delays = query('shunt_path_one_way_delay_seconds_count{direction="rx"} > 0')
        tx = query('shunt_socket_tx_bytes_total{shunt_job="job-55"} > 0')
        if len(up) == 2 and len(delays) == 2 and tx: break
    except Exception as e:
        pass
    time.sleep(0.5)
else:
    fail("Prometheus never scraped both agents with delays and the job's bytes")
print("scraped:", sorted(r["metric"]["instance"] for r in up))
time.sleep(6)
# The job's id: under shunt_job, next to the scrape job's own label.
ranks = query('shunt_process_mode{shunt_job="job-55"}')
got = sorted((r["metric"]["instance"], r["metric"].get("rank"), r["metric"]["job"]) for r in ranks)
if got != [("10.99.0.1:9471", "0", "shunt"), ("10.99.0.2:9471", "1", "shunt")]: fail("shunt_process_mode by job id: %s" % got)
for bad in ("exported_job", "pid", "qpn", "udp_sport", "percentile"):
    if query('count by (__name__) ({%s!=""})' % bad): fail("series labelled %s: %s" % (bad, query('count by (__name__) ({%s!=""})' % bad)))
if query('{__name__=~"shunt_socket.*", local=~".*:.*"}'): fail("socket series with ports")
tx = query('shunt_socket_tx_bytes_total{shunt_job="job-55",rank="0",role="client",local="10.99.0.1",remote="10.99.0.2"}')
if not tx or float(tx[0]["value"][1]) < 10000: fail("rank 0's bytes to B: %s" % tx)
print("labels: shunt_job, rank, job=shunt; no exported_job, pid, qpn or port")
# One-way delays as a histogram, in both directions on both hosts.
meta = api("/api/v1/metadata", metric="shunt_path_one_way_delay_seconds")
if [m["type"] for m in meta.get("shunt_path_one_way_delay_seconds", [])][:1] != ["histogram"]: fail("delay metadata: %s" % meta)
q = query('histogram_quantile(0.5, sum by (instance, direction, le) (rate(shunt_path_one_way_delay_seconds_bucket[30s])))')
dirs = sorted((r["metric"]["instance"], r["metric"]["direction"]) for r in q if r["value"][1] not in ("NaN", "+Inf"))
if len(dirs) != 4: fail("median one-way delay from the histogram: %s" % q)
print("histogram: median one-way delays", {"%s %s" % k: v for k, v in zip(dirs, (r["value"][1] for r in q))})
PY
# Every panel's query; no data only where the metrics are RDMA's (no RDMA here)
ip netns exec $NA python3 "$ROOT/test/e2e/prom_panels.py" "http://127.0.0.1:$pport" "$ROOT/examples/grafana-shunt.json" \
  shunt_bundle_path shunt_qp_ || fail "dashboard queries"
ok "Prometheus: labels, histograms and every dashboard query"
