#!/usr/bin/env bash
# shunt-audit on one machine as two hosts (127.0.0.1 drives, 127.0.0.2
# answers), no RDMA needed:
# - both instances exit with the verdict's status, the one the JSON states;
# - the JSON report has its documented shape: the four branches of the
#   tree, every inner node the worst of its children, the verdict the
#   root's, both hosts' facts, each reaching the other's audit port;
# - the HTML report is one self-contained page: the verdict, a list item
#   per node of the tree, no script, style sheet or image from elsewhere,
#   every element closed; and Debian's Chromium, headless and in a network
#   namespace of its own (loopback only), renders it: its DOM has the
#   verdict and every node, and its screenshot is not blank;
# - an instance with another job key is not let in: the driver gives up
#   after --join-time with status 3 and says which host did not answer.
# timeout: 120
. "$(dirname "$0")/../lib.sh"
AUDIT=$B/bin/shunt-audit
[ -x "$AUDIT" ] || fail "no $AUDIT (make)"
ip -4 addr show lo | grep -q '127.0.0.1/8' || skip "loopback is not 127.0.0.1/8"
port=$(free_port)
KEY=audit-e2e-$$
run() {  # run KEY RANK OUT ARGS...
  local key=$1 rank=$2 out=$3
  shift 3
  SHUNT_JOB_KEY=$key timeout 60 "$AUDIT" --hosts 127.0.0.1,127.0.0.2 --port "$port" --rank "$rank" "$@" > "$out" 2>&1
}

run "$KEY" 1 "$TMP/member.out" --timeout 50 &
member=$!
at_exit "kill $member 2>/dev/null"
run "$KEY" 0 "$TMP/driver.out" --join-time 20 --json "$TMP/r.json" --html "$TMP/r.html"
rc=$?
wait $member
mrc=$?
cat "$TMP/driver.out"
[ -s "$TMP/r.json" ] || fail "no JSON report (exit $rc)"
expect_eq "$rc" "$(jget "$TMP/r.json" 'd["exit"]')" "the driver's exit status is the report's"
expect_eq "$mrc" "$rc" "the other host's exit status"
grep -q "^verdict: " "$TMP/driver.out" || fail "no verdict line"

python3 - "$TMP/r.json" <<'PY' || fail "JSON report"
import json, sys
r = json.load(open(sys.argv[1]))
assert r["schema"] == "shunt-audit/1"
for k in ("verdict", "exit", "summary", "elapsed_s", "hosts", "tree", "matrices", "measurements", "links"):
    assert k in r, "no %s" % k
order = {"pass": 0, "warn": 1, "fail": 2}
def check(n):
    assert n["status"] in order, n
    kids = n.get("children", [])
    if kids:
        w = max(order[check(c)] for c in kids)
        assert order[n["status"]] == w, "%s is %s, its children's worst %d" % (n["name"], n["status"], w)
    return n["status"]
check(r["tree"])
assert [c["name"] for c in r["tree"]["children"]] == ["Software", "Node", "Front-end network", "Back-end network"]
assert r["verdict"] == r["tree"]["status"] and r["exit"] == order[r["verdict"]]
assert [h["addr"] for h in r["hosts"]] == ["127.0.0.1", "127.0.0.2"]
for h in r["hosts"]:
    f = h["facts"]
    for k in ("kernel", "provider_modules", "mptcp", "rdma_core", "memlock", "nccl", "devices", "reach"):
        assert k in f, "%s: no %s" % (h["name"], k)
    assert f["reach"] == [True, True], "%s reaches %s" % (h["name"], f["reach"])
fe = r["tree"]["children"][2]
assert fe["status"] == "pass", fe
print("JSON: shape as documented, verdict %s" % r["verdict"])
PY

python3 - "$TMP/r.json" "$TMP/r.html" <<'PY' || fail "HTML report"
import json, sys, html.parser
r = json.load(open(sys.argv[1]))
def count(n): return 1 + sum(count(c) for c in n.get("children", []))
void = {"meta", "br", "link", "img", "input", "hr"}
class P(html.parser.HTMLParser):
    def __init__(s):
        super().__init__(); s.stack = []; s.li = 0; s.verdict = None; s.ext = []; s.errors = []; s.in_tree = 0
    def handle_starttag(s, t, a):
        a = dict(a)
        if t == "script" or t == "link" or t == "img" or t == "iframe": s.ext.append(t)
        for k in ("src", "href"):
            if k in a: s.ext.append(a[k])
        if t == "p" and a.get("id") == "verdict": s.verdict = a.get("class")
        if t == "ul" and a.get("id") == "tree": s.in_tree = len(s.stack) + 1
        if t == "li" and s.in_tree: s.li += 1
        if t not in void: s.stack.append(t)
    def handle_endtag(s, t):
        if not s.stack or s.stack[-1] != t: s.errors.append("</%s> closes <%s>" % (t, s.stack[-1] if s.stack else "nothing"))
        else: s.stack.pop()
        if s.in_tree and len(s.stack) < s.in_tree: s.in_tree = 0
p = P(); p.feed(open(sys.argv[2]).read()); p.close()
assert not p.errors and not p.stack, "unbalanced: %s, open: %s" % (p.errors[:3], p.stack)
assert p.verdict == r["verdict"], "verdict %s, JSON %s" % (p.verdict, r["verdict"])
assert p.li == count(r["tree"]), "%d list items, %d nodes" % (p.li, count(r["tree"]))
assert not p.ext, "loads from elsewhere: %s" % p.ext
print("HTML: balanced, %d nodes, nothing external" % p.li)
PY

# Rendered by a real browser (installed by `make deps`).
command -v chromium >/dev/null || fail "no chromium (make deps installs it)"
render() {  # render FLAG...: chromium, headless, with no network but loopback
  unshare -n timeout 60 chromium --headless --no-sandbox --disable-gpu --no-first-run \
    --user-data-dir="$TMP/chromium" --window-size=1024,768 "$@" "file://$TMP/r.html" 2>> "$TMP/chromium.err"
}
render --dump-dom > "$TMP/dom.html" || { tail -5 "$TMP/chromium.err"; fail "chromium could not render the report"; }
(cd "$TMP" && render --screenshot="$TMP/shot.png") > /dev/null || { tail -5 "$TMP/chromium.err"; fail "no screenshot"; }
python3 - "$TMP/r.json" "$TMP/dom.html" "$TMP/shot.png" <<'PY' || fail "the rendered report"
import json, sys, html.parser, struct, zlib
r = json.load(open(sys.argv[1]))
def count(n): return 1 + sum(count(c) for c in n.get("children", []))
class P(html.parser.HTMLParser):
    def __init__(s):
        super().__init__(); s.li = 0; s.verdict = None; s.text = []
    def handle_starttag(s, t, a):
        a = dict(a)
        if t == "p" and a.get("id") == "verdict": s.verdict = a.get("class")
        if t == "li": s.li += 1
    def handle_data(s, d): s.text.append(d)
p = P(); p.feed(open(sys.argv[2]).read())
assert p.verdict == r["verdict"], "rendered verdict %s, JSON %s" % (p.verdict, r["verdict"])
assert p.li == count(r["tree"]), "rendered %d list items, %d nodes" % (p.li, count(r["tree"]))
assert "Software" in "".join(p.text), "no tree in the rendered page"
# The screenshot: a PNG whose pixels are not all one colour.
png = open(sys.argv[3], "rb").read()
assert png[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
i, idat, w = 8, b"", 0
while i < len(png):
    n, kind = struct.unpack(">I4s", png[i:i + 8])
    if kind == b"IHDR": w = struct.unpack(">I", png[i + 8:i + 12])[0]
    if kind == b"IDAT": idat += png[i + 8:i + 8 + n]
    i += 12 + n
raw = zlib.decompress(idat)
colours = len(set(raw[1:1 + 4 * w]) | set(raw[len(raw) // 2:len(raw) // 2 + 4 * w]))
assert colours > 2, "the screenshot is blank"
print("rendered by chromium: verdict %s, %d nodes, %d-byte screenshot" % (p.verdict, p.li, len(png)))
PY

# Another key: the driver never gets that host's facts.
run other-key 1 "$TMP/stranger.out" --timeout 15 &
stranger=$!
at_exit "kill $stranger 2>/dev/null"
run "$KEY" 0 "$TMP/driver2.out" --join-time 3 -q
expect_eq "$?" 3 "driver with a host of another key"
grep -q "127.0.0.2 did not answer" "$TMP/driver2.out" || { cat "$TMP/driver2.out"; fail "no word of the host that did not answer"; }
kill $stranger 2>/dev/null
wait $stranger 2>/dev/null
ok "audit reports"
