#!/usr/bin/env bash
# timeout: 900
# shunt-audit on 4 soft-RoCE guests, 2 rails, 2 spines, started on every
# host the way a job is (shunt-fabric exec here), h1 driving:
# - the healthy fabric passes: exit 0 on every host, no check failed or
#   warned, every ordered pair measured on both rails, through both spines
#   where path discovery found them; the JSON and HTML reports are whole;
#   the probe mesh heard every path on both rails with no path over its
#   loss threshold, and the HTML has the per-rail, per-spine and probe
#   matrices;
# - with four faults at once (h2's rail-1 port down, h4's rail-1 NIC at
#   MTU 1000 while the others have 1500, h1's rail-0 leaf uplink to one
#   spine limited by tbf, h3's rail-0 leaf uplink to the other spine
#   dropping 3% both ways), each is reported where it is: that
#   port's state, that NIC's MTU, each of those leaf-spine links (the lossy
#   one by its probes' loss), and nothing else fails or warns.
# Every host runs it with libshunt.so preloaded, as a job's processes
# would (NCCL, installed here, is then reached). Soft-RoCE on emulated CPUs
# is noisy: identical paths differ up to 3x in bandwidth, and latency moves by
# up to 10 ms with the host's load, so the audit runs with wider thresholds
# than its defaults (made for real NICs): latency within 100 ms of the
# median passes, and retransmit counters may rise by 5000 (a guest that
# gets no CPU for a while has its peers retry: a healthy run saw +1062).
# The guests' clocks are set from the host's at boot and nothing
# disciplines them: they are hundreds of ms apart, and shunt's estimate of
# them is good to a few ms under emulation, so the clock checks get 5 s and
# 50 ms. A healthy guest's paths lost up to 1.8% of their probes over 10 s
# (a guest whose CPU stalls drops what arrives meanwhile, in bursts): here
# the mesh probes for 20 s, a pair every 50 ms, and warns at 2%; the lossy
# link drops 3% (at 6% the RC connections through it fail, which the
# audit reports as their pairs'). The faults are far beyond the bandwidth
# thresholds.
# The time each audit took is printed (the bound the tool is meant to meet
# is 3 minutes for this fabric; no test asserts a time).
. "$(dirname "$0")/lib.sh"
need_guests
AUDIT=$B/bin/shunt-audit
[ -x "$AUDIT" ] || fail "no $AUDIT (make)"
up --hosts 4 --rails 2 --spines 2
KEY=audit-$$
OPTS=(--bw-warn 0.3 --bw-fail 0.2 --lat-slack-us 100000 --retrans-warn 5000 --clock-warn-ms 5000
  --clock-bound-us 50000 --loss-warn 0.02 --probe-ms 50 --probe-s 20)
HOSTS=$(for i in 1 2 3 4; do fab addr h$i r0; done | paste -sd,)

# audit TAG: shunt-audit on every host; h1's exit status in $TMP/TAG.rc,
# its output in $TMP/TAG.out, its reports in $TMP/TAG.json and TAG.html.
audit() {
  local tag=$1 i pids=() t0=$SECONDS
  for i in 4 3 2; do
    fab exec h$i -- timeout 400 env SHUNT_JOB_KEY="$KEY" LD_PRELOAD="$LIB" "$AUDIT" --hosts "$HOSTS" --timeout 380 \
      > "$TMP/$tag.h$i.out" 2>&1 &
    pids+=($!)
  done
  fab exec h1 -- timeout 400 env SHUNT_JOB_KEY="$KEY" LD_PRELOAD="$LIB" "$AUDIT" --hosts "$HOSTS" "${OPTS[@]}" \
    --json /tmp/$tag.json --html /tmp/$tag.html > "$TMP/$tag.out" 2>&1
  echo $? > "$TMP/$tag.rc"
  for i in "${pids[@]}"; do wait "$i" || echo "a host's audit exited $?" >> "$TMP/$tag.others"; done
  note "$tag: audit took $((SECONDS - t0))s, exit $(cat "$TMP/$tag.rc")"
  grep -v '^\[shunt-audit ' "$TMP/$tag.out"
  fab exec h1 -- cat /tmp/$tag.json > "$TMP/$tag.json" || fail "$tag: no JSON report"
  fab exec h1 -- cat /tmp/$tag.html > "$TMP/$tag.html" || fail "$tag: no HTML report"
}

note "healthy fabric"
audit healthy
python3 - "$TMP/healthy.json" "$TMP/healthy.html" <<'PY' || fail "healthy fabric"
import json, sys, html.parser
r = json.load(open(sys.argv[1]))
bad = []
def walk(n, path):
    p = path + [n["name"]]
    if n["status"] != "pass":
        if not n.get("children"):
            bad.append("%s: %s %s" % (" / ".join(p), n["status"], n.get("detail", "")))
    for c in n.get("children", []):
        walk(c, p)
walk(r["tree"], [])
assert not bad, "checks that did not pass:\n" + "\n".join(bad)
assert r["verdict"] == "pass" and r["exit"] == 0, r["verdict"]
names = [h["name"] for h in r["hosts"]]
assert len(names) == 4, names
for rail in (0, 1):
    pairs = {(m["src"], m["dst"]) for m in r["measurements"] if m["rail"] == rail and "mbps" in m}
    assert len(pairs) == 12, "rail %d: %d of 12 ordered pairs measured" % (rail, len(pairs))
routers = {m["router"] for m in r["measurements"] if m["router"]}
print("routers named by path discovery: %s" % sorted(routers))
m = r["matrices"]
assert [x["rail"] for x in m] == [0, 1], "one matrix per rail"
spines = sorted((x["rail"], x["spine"]) for x in r["spine_matrices"])
assert spines == [(0, 0), (0, 1), (1, 0), (1, 1)], "per-spine matrices: %s" % spines
pr = r["probes"]
paths = pr["paths"]
rail_paths = [x for x in paths if not x["sport"]]
assert len(rail_paths) == 24, "%d probe-port paths, not 2 x 12" % len(rail_paths)
assert len(paths) > 24, "no path probed from a measurement's source port"
assert all(x["heard"] and x["status"] == "pass" for x in paths), [x for x in paths if x["status"] != "pass"]
owd = sorted(x["owd_us"] for x in paths if "owd_us" in x)
print("probe mesh: %d paths over %.0f s, worst loss %.2f%%, one-way delay median %.0f us; clocks: %s" % (
    len(paths), pr["seconds"], 100 * max(x["loss"] for x in paths), owd[len(owd) // 2] if owd else -1,
    ", ".join("%s %+.0f ms (%.0f us)" % (c["host"], c.get("offset_ms", 0), c.get("bound_us", 0)) for c in pr["clocks"])))
class P(html.parser.HTMLParser):
    def __init__(s):
        super().__init__(); s.tables = {}; s.ext = []; s.cells = 0
    def handle_starttag(s, t, a):
        a = dict(a)
        if t == "table": s.tables[a.get("class")] = s.tables.get(a.get("class"), 0) + 1
        if t == "td": s.cells += 1
        for k in ("src", "href"):
            if a.get(k, "").startswith(("http:", "https:", "//")): s.ext.append(a[k])
p = P(); p.feed(open(sys.argv[2]).read())
want = {"matrix": 2, "matrix spine": 4, "matrix probes": 2}
assert p.tables == want and p.cells == 8 * 16, "HTML: tables %s, %d cells" % (p.tables, p.cells)
assert not p.ext, "HTML loads %s" % p.ext
print("healthy: pass, 2 x 12 pairs measured and probed, HTML has the rail, spine and probe matrices")
PY
[ "$(cat "$TMP/healthy.rc")" = 0 ] || fail "healthy: h1 exited $(cat "$TMP/healthy.rc")"
[ -e "$TMP/healthy.others" ] && { cat "$TMP/healthy.others" "$TMP"/healthy.h*.out; fail "healthy: a host did not exit 0"; }

note "faults: h2 r1 port down, h4 r1 MTU 1000, h1's rail-0 uplink to s1 limited, h3's to s2 lossy"
fab fault port-down h2 r1 >/dev/null || fail "port-down h2 r1"
fab exec h4 -- ip link set r1 mtu 1000 || fail "mtu on h4"
# A tenth of what one measured path carried through a spine when healthy:
# slow whatever the host's load does to soft-RoCE.
limit=$(python3 -c "
import json, sys, statistics
r = json.load(open(sys.argv[1]))
v = statistics.median(m['mbps'] for m in r['measurements'] if 'mbps' in m)
print(round(max(0.3, v * 8 / 10), 2))" "$TMP/healthy.json")
fab fault rate l1r0-s1 "$limit" --queue-ms 200 >/dev/null || fail "rate l1r0-s1"
note "l1r0-s1 limited to $limit Mbit/s"
fab fault loss l3r0-s2 3 >/dev/null || fail "loss l3r0-s2"
audit faults
[ "$(cat "$TMP/faults.rc")" = 2 ] || fail "faults: h1 exited $(cat "$TMP/faults.rc"), not 2"
python3 - "$TMP/faults.json" <<'PY' || fail "faults not reported where they are"
import json, sys
r = json.load(open(sys.argv[1]))
leaves = []
def walk(n, path):
    p = path + [n["name"]]
    if not n.get("children"):
        leaves.append((p, n))
    for c in n.get("children", []):
        walk(c, p)
walk(r["tree"], [])
bad = [(p, n) for p, n in leaves if n["status"] != "pass"]
for p, n in bad:
    print("%s %s: %s" % (n["status"].upper(), " / ".join(p), n.get("detail", "")))
def has(status, *parts):
    return any(n["status"] == status and all(x in p for x in parts) for p, n in bad)
assert has("fail", "Node", "h2", "rxe1 port 1", "state"), "h2's rxe1 port not failed"
assert any(n["status"] != "pass" and "Node" in p and "h4" in p and "rxe1 port 1" in p and
           ("mtu" in p or any("MTU" in x for x in p)) for p, n in bad), "h4's rxe1 MTU not reported"
# l1r0-s1's spine end is 192.168.0.2 (docs/fabric.md: X = 0, J = 1)
links = [l for l in r["links"] if l["rail"] == 0 and l["host"] == "h1" and l["router"] == "192.168.0.2"]
assert links, "h1's rail-0 uplink to s1 not named (links: %s)" % r["links"]
assert any(has(s, "Back-end network", "rail 0", "leaf-spine links") for s in ("warn", "fail")), "no link in the tree"
# l3r0-s2's spine end is 192.168.4.6 (X = 4, J = 2): named by its probes' loss
lossy = [l for l in r["links"] if l["rail"] == 0 and l["host"] == "h3" and l["router"] == "192.168.4.6"]
assert lossy and lossy[0].get("loss", 0) >= 0.01, "h3's rail-0 uplink to s2 not named lossy (links: %s)" % r["links"]
print("lossy link: %s" % lossy[0])
assert len(r["links"]) == 2, "links other than these two: %s" % r["links"]
# Everything else passed: every other leaf that did not pass is one of these.
# A pair whose path crosses the lossy link (into h3's leaf from s2, or out
# of it to s2) may fail outright: rxe's RC connection through 3% loss ran
# out of retries once in a clean-clone run (h2 -> h3 via 192.168.2.6), as
# it does at 6% most of the time; that is the lossy link's doing.
import re
def crosses_lossy(p):
    return "pairs" in p and bool(re.search(r"(-> h3 via 192\.168\.\d+\.6|^h3 -> \S+ via 192\.168\.4\.6)$", p[-1]))
for p, n in bad:
    ok = ("h2" in p and "rxe1 port 1" in p) or ("h4" in p and "rxe1 port 1" in p) or "leaf-spine links" in p
    ok = ok or crosses_lossy(p)
    assert ok or n["status"] == "warn", "also failed: %s" % " / ".join(p)
    assert ok, "also warned: %s (%s)" % (" / ".join(p), n.get("detail", ""))
print("faults: each at its place, nothing else")
PY
echo "PASS"
