#!/usr/bin/env bash
# examples/grafana-shunt.json is valid JSON, every panel has a query, and
# every metric its queries name exists in a live scrape of /metrics.
# timeout: 60
. "$(dirname "$0")/../lib.sh"
mport=$(free_port)
export SHUNT_RUN_DIR=$TMP/run SHUNT_MODE=observe SHUNT_METRICS_ADDR=127.0.0.1:$mport
mkdir -p "$SHUNT_RUN_DIR"
LD_PRELOAD=$LIB "$B/test/hold_socket" 20000 & a=$!
at_exit "kill $a 2>/dev/null"
for i in $(seq 50); do
  python3 -c 'import sys, urllib.request; sys.stdout.write(urllib.request.urlopen(sys.argv[1], timeout=5).read().decode())' \
    "http://127.0.0.1:$mport/metrics" > "$TMP/m" 2>/dev/null && break
  sleep 0.1
done
grep -q '^# TYPE shunt_build_info gauge' "$TMP/m" || fail "no live scrape"
python3 - "$ROOT/examples/grafana-shunt.json" "$TMP/m" <<'PY' || fail "dashboard"
import json, re, sys
d = json.load(open(sys.argv[1]))
scrape = open(sys.argv[2]).read()
families = set(re.findall(r"^# TYPE (\S+) ", scrape, re.M))
used = set()
for p in d["panels"]:
    if p["type"] == "row": continue
    assert p.get("targets"), "panel without a query: " + p["title"]
    for t in p["targets"]:
        # metric names: not label names (in by/without or a selector), not $variables
        e = re.sub(r"\b(by|without)\s*\([^)]*\)|\{[^}]*\}", "", t["expr"])
        used |= {re.sub(r"_(bucket|sum|count)$", "", m) for m in re.findall(r"(?<![$\w])(shunt_[a-z_]+)\b", e)}
missing = sorted(used - families)
print(len(used), "metrics queried;", len(families), "in the scrape")
assert not missing, "queried but not exported: %s" % missing
assert d["uid"] and d["title"] and d["schemaVersion"] >= 30
PY
ok "every metric the dashboard queries is exported"
