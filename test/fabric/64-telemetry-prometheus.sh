#!/usr/bin/env bash
# timeout: 420
# Debian's Prometheus, in the namespace of their leaf, scrapes the host
# agents of a live verbs job on two soft-RoCE guests under it (shunt-bench
# all-to-all under the preload, active bundles, the agents probing each
# other): every panel's query of examples/grafana-shunt.json returns data,
# the bundle paths' and QPs' included (completion errors only once there
# is one).
. "$(dirname "$0")/lib.sh"
need_guests
command -v prometheus >/dev/null || skip "no prometheus (make deps)"
BENCH=$B/bin/shunt-bench
[ -f "$LIB" ] || fail "no $LIB (make)"
up --hosts 2 --rails 1 --spines 2 --hosts-per-leaf 2  # one leaf: its namespace reaches both guests
a1=$(fab addr h1 r0) a2=$(fab addr h2 r0)
KEY=prom-fabric-$$ port=$((30000 + RANDOM % 2000))
# The job: each guest's only preloaded process is its host's agent, serving
# metrics on every address, probing the other guest.
for r in 1 0; do
  h=h$((r + 1)) me=$a1 peer=$a2
  [ $r = 1 ] && me=$a2 peer=$a1
  fab exec $h -- timeout 300 env LD_PRELOAD="$LIB" SHUNT_JOB_KEY="$KEY" SHUNT_JOB_ID=job-64 SHUNT_METRICS_ADDR=:9471 \
    SHUNT_PROBE_ADDRS="$me" SHUNT_PROBE_NAME="$me" SHUNT_PEERS="$peer=$peer" \
    "$BENCH" --rank $r --world 2 --bootstrap "$a1:$port" --transport verbs -d rxe0 --verb write_imm \
    -b 256K -e 256K -w 1 -c 1 --seg 64K --duration 150 --qp-timeout 18 --stall-timeout 60 > "$TMP/rank$r" 2>&1 &
  eval "job$r=\$!"
done
pport=$((9100 + RANDOM % 800))
cat > "$TMP/prom.yml" <<YML
global: {scrape_interval: 1s, evaluation_interval: 1s}
scrape_configs:
  - job_name: shunt
    static_configs: [{targets: ["$a1:9471", "$a2:9471"]}]
YML
leaf=sf-$NAME-l1r0
ip netns exec "$leaf" prometheus --config.file="$TMP/prom.yml" --storage.tsdb.path="$TMP/tsdb" \
  --web.listen-address=127.0.0.1:$pport --log.level=warn > "$TMP/prom.log" 2>&1 &
prom=$!
trap 'r=$?; kill $prom 2>/dev/null; wait $prom 2>/dev/null; (exit $r); cleanup' EXIT
# Until both agents were scraped with a bundle's paths and the probes'
# delays, then long enough for the dashboard's rate() windows.
ip netns exec "$leaf" python3 - "http://127.0.0.1:$pport" <<'PY' || { tail -n 5 "$TMP/prom.log" "$TMP/rank0"; fail "no bundle in the metrics"; }
import json, sys, time, urllib.parse, urllib.request
def query(e):
    url = sys.argv[1] + "/api/v1/query?" + urllib.parse.urlencode({"query": e})
    return json.load(urllib.request.urlopen(url, timeout=10))["data"]["result"]
end = time.time() + 150
while time.time() < end:
    try:
        up = query('up{job="shunt"} == 1')
        paths = query('shunt_bundle_paths{shunt_job="job-64"} > 0')
        delays = query('shunt_path_one_way_delay_seconds_count > 0')
        sent = query('shunt_bundle_path_tx_bytes_total{shunt_job="job-64"} > 0')
        if len(up) == 2 and len({r["metric"]["instance"] for r in paths}) == 2 and delays and sent:
            break
    except Exception:
        pass
    time.sleep(1)
else:
    print("FAIL: no bundle paths, delays or bytes from both agents"); sys.exit(1)
time.sleep(20)
print("paths in service:", {r["metric"]["instance"]: r["value"][1] for r in query('sum by (instance) (shunt_bundle_path_up)')})
PY
# (no errors on a healthy job: the completion-error series exist once one happens)
ip netns exec "$leaf" python3 "$ROOT/test/e2e/prom_panels.py" "http://127.0.0.1:$pport" "$ROOT/examples/grafana-shunt.json" \
  shunt_qp_errors_total ||
  fail "dashboard queries on a live verbs job"
note "every dashboard query returns data from a live verbs job"
kill "$job0" "$job1" 2>/dev/null
wait "$job0" "$job1" 2>/dev/null
exit 0
