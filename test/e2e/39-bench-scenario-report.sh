#!/usr/bin/env bash
# timeout: 30
# The report of `shunt-bench scenario` (shunt-bench-scenario-report, next to
# the scenario script) on results made up here, no fabric needed: a
# shunt-bench run (timeline, marks, ranks' errors, stats, events) and an
# unchanged program's run (its own output) give the table and summary.json.
. "$(dirname "$0")/../lib.sh"
REPORT=$B/bin/shunt-bench-scenario-report
[ -f "$REPORT" ] || skip "shunt-bench-scenario-report not built ($REPORT)"

python3 - "$TMP" <<'PY' || fail "cannot make the results"
import json, os, sys
base = sys.argv[1]
def w(d, f, s):
    os.makedirs(d, exist_ok=True)
    open(os.path.join(d, f), "w").write(s)
start = 1000.0
def samples(stop_from, stop_to, end):  # 2 GB/s, none from stop_from to stop_to
    # every 1/8 s: exact in binary, so no sample is on a window's edge by rounding
    return [[start + t / 8, t / 8, 0, 0.0 if stop_from < t / 8 <= stop_to else 2.0, 0] for t in range(1, int(end * 8) + 1)]
d = base + "/sb"  # shunt-bench, blackhole at 7 s, healed at 11 s
w(d, "without.rc", "1\n"); w(d, "with.rc", "0\n")
w(d, "without.json", json.dumps({"errors": 3, "wrong_total": None, "error": "stalled",
    "timeline": {"start_wall": start, "samples": samples(7, 99, 15)}, "marks": [{"t": 7.0, "label": "blackhole"}]}))
w(d, "with.json", json.dumps({"errors": 0, "wrong_total": 0,
    "timeline": {"start_wall": start, "samples": samples(7, 7.5, 20)},
    "marks": [{"t": 7.0, "label": "blackhole"}, {"t": 11.0, "label": "healed"}]}))
w(d, "without.rank0.out", "shunt-bench: bootstrap: error: peer gone\n")
w(d, "without.rank1.out", "shunt-bench: error: verbs: retry exceeded\n")
w(d, "with.spine", "s2\n")
w(d, "with.stats0.json", json.dumps({"verbs": {"qps": [{"bundle": {"replayed_bytes": 4096}}]}}))
w(d, "with.stats1.json", json.dumps({"verbs": {"qps": [{"bundle": {"replayed_bytes": 1000}}]}}))
ev = [("path_down", 1, "probes_lost", 7.25), ("path_up", 1, "ok", 12.5)]
w(d, "with.events0.jsonl", "".join(json.dumps({"event": e, "device": "rxe0", "qpn": 5, "path": p, "status": s,
    "wall_ns": int((start + t) * 1e9)}, separators=(",", ":")) + "\n" for e, p, s, t in ev))
w(d, "blackhole.png", "")
d = base + "/tool"  # ib_write_bw, link down for good
w(d, "without.rc", "124\n"); w(d, "with.rc", "0\n")
w(d, "without.client.out", "Couldn't post send: timed out\n")
w(d, "with.client.out", " 65536 5000 1200.50 1180.25 0.018\n")
w(d, "without.ran", "34.2\n"); w(d, "with.ran", "20.1\n")
w(d, "with.marks", "@2000.5:link-down\n")
w(d, "with.events0.jsonl", json.dumps({"event": "path_down", "device": "rxe0", "qpn": 9, "path": 0,
    "status": "port_down", "wall_ns": int(2000.9e9)}) + "\n")
PY

# row NAME: the table's row of that name, its columns joined by "|"
row() { sed -n "s/^$1  *//p" "$TMP/out" | sed 's/  \{2,\}/|/; s/ *$//'; }

python3 "$REPORT" "$TMP/sb" blackhole alltoall >"$TMP/out" 2>&1 || { cat "$TMP/out"; fail "report exited $?"; }
cat "$TMP/out"
expect_eq "$(sed -n 2p "$TMP/out" | tr -s ' ' | sed 's/ $//')" "scenario blackhole without libshunt with libshunt" "header"
expect_eq "$(row 'exit status')" "1|0" "exit status"
expect_eq "$(row 'GB\/s before the fault')" "2.000|2.000" "GB/s before"
expect_eq "$(row 'time to recover')" "never (failed at 15.0 s)|1.5 s" "time to recover"
expect_eq "$(row 'path found down by')" "-|its lost probes" "found down by"
expect_eq "$(row 'bytes replayed')" "-|5096" "bytes replayed"
expect_eq "$(row 'failback after healing')" "-|1.5 s" "failback"
grep -qx "plot  *$TMP/sb/blackhole.png" "$TMP/out" || fail "plot line"
grep -qx "first error without libshunt: shunt-bench: error: verbs: retry exceeded" "$TMP/out" || fail "first error"
python3 - "$TMP/sb/summary.json" <<'PY' || fail "summary.json"
import json, sys
s = json.load(open(sys.argv[1]))
assert s["scenario"] == "blackhole", s
assert s["with"]["fault on spine"] == "s2" and s["with"]["path down after"] == "0.25 s", s["with"]
assert s["without"]["first_error"] == "shunt-bench: error: verbs: retry exceeded" and s["with"]["first_error"] == "", s
PY

python3 "$REPORT" "$TMP/tool" link-down ib_write_bw >"$TMP/out" 2>&1 || { cat "$TMP/out"; fail "report exited $?"; }
cat "$TMP/out"
expect_eq "$(row 'exit status')" "124|0" "tool exit status"
expect_eq "$(row result)" "none printed|1180.2 MB/s (BW average)" "tool result"
expect_eq "$(row 'client ran for')" "34.2 s|20.1 s" "tool ran for"
expect_eq "$(row 'path found down by')" "-|port event" "tool found down by"
grep -q "GB/s" "$TMP/out" && fail "an unchanged program has no timeline"
ok "scenario report"
