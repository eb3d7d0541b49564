#!/usr/bin/env bash
# The host agent serves /metrics merging every member's report: promtool
# accepts a scrape taken while an alltoall runs, the socket counters equal
# the bytes a client/server pair exchanged, the textfile is never seen half
# written while it is rewritten, and odd requests get HTTP errors.
# timeout: 120
. "$(dirname "$0")/../lib.sh"
command -v promtool >/dev/null || skip "promtool not installed (apt-get install prometheus)"
mport=$(free_port)
export SHUNT_RUN_DIR=$TMP/run SHUNT_MODE=observe SHUNT_REPORT_INTERVAL_MS=100 \
  SHUNT_METRICS_ADDR=127.0.0.1:$mport SHUNT_METRICS_TEXTFILE=$TMP/shunt.prom SHUNT_METRICS_INTERVAL_MS=100 \
  SHUNT_JOB_ID=job-50
mkdir -p "$SHUNT_RUN_DIR"
scrape() { python3 -c 'import sys, urllib.request; sys.stdout.write(urllib.request.urlopen(sys.argv[1], timeout=5).read().decode())' \
  "http://127.0.0.1:$mport/metrics"; }
# metric NAME 'LABEL="V",...' FILE: the sum of the samples with those labels (a client
# that retried its connect has one more socket, with no bytes)
metric() { python3 - "$@" <<'PY'
import re, sys
name, want, path = sys.argv[1], sys.argv[2], sys.argv[3]
wl = dict(re.findall(r'(\w+)="([^"]*)"', want))
vals = []
for line in open(path):
    m = re.match(r'^(\w+)(?:\{(.*)\})? (\S+)$', line.strip())
    if not m or m.group(1) != name: continue
    labels = dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', m.group(2) or ""))
    if all(labels.get(k) == v for k, v in wl.items()): vals.append(float(m.group(3)))
print("%g" % sum(vals) if vals else "no sample")
PY
}

# The first process is the agent; it lives through the test (as long as
# its time limit: 60 s was once too short on a loaded host, and the last
# scrapes found no agent).
LD_PRELOAD=$LIB "$B/test/hold_socket" 130000 & agent=$!
at_exit "kill $agent 2>/dev/null"
for i in $(seq 50); do scrape > "$TMP/m0" 2>/dev/null && break; sleep 0.1; done
grep -q '^shunt_build_info{version="' "$TMP/m0" || fail "no /metrics on port $mport"
ok "agent serves /metrics"

# A scrape during traffic: a 4-rank tcp alltoall under the preload.
bport=$(free_port)
for r in 0 1 2 3; do
  RANK=$r LD_PRELOAD=$LIB timeout 60 "$B/bin/shunt-bench" --rank $r --world 4 --bootstrap 127.0.0.1:$bport \
    --transport tcp -b 64K -e 4M -f 2 -n 40 -w 2 > "$TMP/bench$r.out" 2>&1 &
  eval "b$r=\$!"
done
at_exit "kill $b0 $b1 $b2 $b3 2>/dev/null"
sleep 1.5
scrape > "$TMP/m1" || fail "scrape during traffic"
promtool check metrics < "$TMP/m1" || fail "promtool rejects the live scrape"
ok "promtool check metrics passes during traffic"
python3 - "$TMP/m1" <<'PY' || fail "live scrape lacks the ranks' traffic"
import re, sys
ranks = {}
for line in open(sys.argv[1]):
    m = re.match(r'^shunt_socket_tx_bytes_total\{(.*)\} (\d+)$', line)
    if m:
        l = dict(re.findall(r'(\w+)="([^"]*)"', m.group(1)))
        if "rank" in l: ranks[l["rank"]] = ranks.get(l["rank"], 0) + int(m.group(2))
print("tx bytes by rank during traffic:", ranks)
assert sorted(ranks) == ["0", "1", "2", "3"] and all(v > 0 for v in ranks.values())
PY
for r in 0 1 2 3; do eval "wait \$b$r" || fail "bench rank $r failed: $(tail -3 "$TMP/bench$r.out")"; done

# Exact counts: a client/server pair sends 12000 bytes each way.
port=$(free_port)
RANK=10 LD_PRELOAD=$LIB "$B/test/tcp_pair" server "$port" & srv=$!
RANK=11 LD_PRELOAD=$LIB "$B/test/tcp_pair" client "$port" & cli=$!
wait $cli || fail "client failed"
wait $srv || fail "server failed"
# Their final reports reach the agent as they exit: wait for both (a loaded
# host took over 0.5 s), bounded.
for i in $(seq 50); do
  sleep 0.2
  scrape > "$TMP/m2" || continue
  [ "$(metric shunt_processes 'state="exited"' "$TMP/m2")" = 6 ] && break
done
promtool check metrics < "$TMP/m2" || fail "promtool rejects the scrape after traffic"
expect_eq "$(metric shunt_socket_tx_bytes_total 'rank="11",role="client",shunt_job="job-50"' "$TMP/m2")" 12000 "client tx bytes"
expect_eq "$(metric shunt_socket_rx_bytes_total 'rank="11",role="client"' "$TMP/m2")" 12000 "client rx bytes"
expect_eq "$(metric shunt_socket_tx_bytes_total 'rank="10",role="accepted",local="127.0.0.1"' "$TMP/m2")" 12000 "server tx bytes"
expect_eq "$(metric shunt_socket_rx_bytes_total 'rank="10",role="accepted"' "$TMP/m2")" 12000 "server rx bytes"
expect_eq "$(metric shunt_socket_accepts_total 'rank="10"' "$TMP/m2")" 1 "accepts"
for m in shunt_failovers_total shunt_failbacks_total shunt_replays_total; do
  expect_eq "$(metric $m 'rank="11"' "$TMP/m2")" 0 "$m declared"
done
expect_eq "$(metric shunt_processes 'state="exited"' "$TMP/m2")" 6 "exited members (4 ranks, client, server)"

# The textfile: read it over and over while the agent rewrites it every
# 100 ms; every read is a whole exposition (ends with the last family).
python3 - "$TMP/shunt.prom" <<'PY' || fail "textfile seen incomplete"
import os, sys, time
path = sys.argv[1]; seen = set(); reads = 0
end = time.time() + 3
while time.time() < end:
    try: t = open(path).read()
    except FileNotFoundError: continue
    reads += 1
    assert t.endswith("\n") and "# TYPE shunt_peer_rtt_seconds gauge" in t and t.startswith("# HELP shunt_build_info"), "partial read"
    st = os.stat(path); seen.add((st.st_ino, st.st_mtime_ns))
print(f"{reads} reads, {len(seen)} versions, all whole")
assert len(seen) >= 10, "the textfile was not rewritten"
PY
promtool check metrics < "$TMP/shunt.prom" || fail "promtool rejects the textfile"
ok "textfile always whole, promtool accepts it"

# HTTP edges: unknown path 404, POST 405, HEAD has no body.
python3 - "$mport" <<'PY' || fail "HTTP edge cases"
import http.client, sys
c = http.client.HTTPConnection("127.0.0.1", int(sys.argv[1]), timeout=5)
c.request("GET", "/nope"); r = c.getresponse(); assert r.status == 404, r.status; r.read(); c.close()
c = http.client.HTTPConnection("127.0.0.1", int(sys.argv[1]), timeout=5)
c.request("POST", "/metrics", body="x"); r = c.getresponse(); assert r.status == 405, r.status; r.read(); c.close()
c = http.client.HTTPConnection("127.0.0.1", int(sys.argv[1]), timeout=5)
c.request("GET", "/metrics"); r = c.getresponse()
assert r.status == 200 and r.getheader("Content-Type").startswith("text/plain; version=0.0.4"), r.getheader("Content-Type")
assert int(r.getheader("Content-Length")) == len(r.read())
print("404, 405, 200 with format 0.0.4")
PY
ok "HTTP answers"
