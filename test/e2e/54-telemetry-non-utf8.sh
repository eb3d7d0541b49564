#!/usr/bin/env bash
# Bytes that are not UTF-8 in the job's identity (SHUNT_JOB_ID,
# SLURM_JOB_ID, TORCHELASTIC_RUN_ID), the event-log path and the stats-file
# path: every process under the preload starts, reports and exits 0; the
# agent answers GET /metrics with U+FFFD in their place and the members'
# reports arrive; the stats files and the event log are written, valid JSON.
# timeout: 60
. "$(dirname "$0")/../lib.sh"
bad=$'\xff\xfe'
mport=$(free_port)
export SHUNT_RUN_DIR=$TMP/run SHUNT_MODE=observe SHUNT_REPORT_INTERVAL_MS=100 SHUNT_METRICS_ADDR=127.0.0.1:$mport \
  SHUNT_JOB_ID="job$bad" SLURM_JOB_ID="slurm$bad" TORCHELASTIC_RUN_ID="te$bad" \
  SHUNT_EVENT_LOG="$TMP/events$bad.%p.log" SHUNT_STATS_FILE="$TMP/stats$bad.%p.json"
mkdir -p "$SHUNT_RUN_DIR"
scrape() { python3 -c 'import sys, urllib.request; sys.stdout.write(urllib.request.urlopen(sys.argv[1], timeout=5).read().decode("utf-8"))' \
  "http://127.0.0.1:$mport/metrics"; }

# The agent (first process), then two members whose job id comes from the
# launcher's variables (SHUNT_JOB_ID unset).
LD_PRELOAD=$LIB "$B/test/hold_socket" 15000 & a=$!
at_exit "kill $a 2>/dev/null"
end=$((SECONDS + 15))
while [ $SECONDS -lt $end ] && kill -0 $a 2>/dev/null; do scrape > "$TMP/m0" 2>/dev/null && break; sleep 0.1; done
kill -0 $a 2>/dev/null || fail "the agent's process is gone at start ($(wait $a; echo exit $?))"
grep -q '^shunt_build_info{version="' "$TMP/m0" || fail "no /metrics from the agent"
ok "the agent serves /metrics"
env -u SHUNT_JOB_ID LD_PRELOAD=$LIB "$B/test/hold_socket" 300 || fail "a member (job id from SLURM_JOB_ID) exited $?"
env -u SHUNT_JOB_ID -u SLURM_JOB_ID LD_PRELOAD=$LIB "$B/test/hold_socket" 300 || fail "a member (job id from TORCHELASTIC_RUN_ID) exited $?"
ok "both members exit 0"

# Their reports arrive; every label is UTF-8 with U+FFFD for each bad byte.
fffd=$'\xef\xbf\xbd'
end=$((SECONDS + 10))
while [ $SECONDS -lt $end ]; do
  scrape > "$TMP/m1" 2>/dev/null && grep -q '^shunt_processes{state="exited"} 2$' "$TMP/m1" && break
  sleep 0.1
done
grep -q '^shunt_processes{state="exited"} 2$' "$TMP/m1" || fail "the members' last reports did not arrive: $(grep '^shunt_processes' "$TMP/m1")"
for j in "job" "slurm" "te"; do
  grep -q "shunt_job=\"$j$fffd$fffd\"" "$TMP/m1" || fail "no sample labelled shunt_job=\"$j<U+FFFD><U+FFFD>\""
done
ok "/metrics has the three job ids, each bad byte as U+FFFD"
kill -0 $a 2>/dev/null || fail "the agent's process is gone"
wait $a || fail "the agent's process exited $?"
ok "the agent's process exits 0"

# At exit each process wrote its stats file; the agent wrote its event log
# from its start (members write one at their first event).
python3 - "$TMP" <<'PY' || fail "stats files or event logs"
import json, os, sys
d = os.fsencode(sys.argv[1])
names = os.listdir(d)
stats = [n for n in names if n.startswith(b"stats\xff\xfe.")]
logs = [n for n in names if n.startswith(b"events\xff\xfe.")]
assert len(stats) == 3, ("stats files", names)
assert len(logs) >= 1, ("no event log (the agent writes one at start)", names)
for n in stats:
    s = json.loads(open(os.path.join(d, n), "rb").read().decode("utf-8"))
    assert s["job"] in ("job\ufffd\ufffd", "slurm\ufffd\ufffd", "te\ufffd\ufffd"), s["job"]
    assert s["event_log"].startswith(sys.argv[1] + "/events\ufffd\ufffd."), s["event_log"]
for n in logs:
    lines = open(os.path.join(d, n), "rb").read().decode("utf-8").splitlines()
    first = json.loads(lines[0])
    assert first["event"] == "config" and first["set"]["SHUNT_EVENT_LOG"].startswith(sys.argv[1] + "/events\ufffd\ufffd"), first
    for l in lines: json.loads(l)
print(len(stats), "stats files,", len(logs), "event logs, all UTF-8 JSON")
PY
ok "stats files and event logs are valid JSON"
