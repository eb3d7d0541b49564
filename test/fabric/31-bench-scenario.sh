#!/usr/bin/env bash
# timeout: 720
# `shunt-bench scenario` as a new user runs it: no --probes and no SHUNT_*
# variable but the job key the scenario sets (as shunt-run does).
# First `blackhole --link l1r0-s1` (the demo's), shortened: both runs
# (without and with libshunt) happen on a fresh fabric, the fault is marked
# on their timelines, the side-by-side table has every row, the plot is
# drawn, and the fabric is gone afterwards. The run with libshunt rides out
# the silent fault with no error seen by the application, and its paths are
# found down by their lost probes (the agents' probe engines run on the
# rails found behind the guests' RoCE ports): with an ACK timeout of 268 ms
# and 7 retries, retransmissions would report the fault after ~2 s, the
# probes within ~1 s. Then unchanged programs: ib_write_bw and fi_pingpong
# under a link lost for good; and the benchmark over TCP (`--transport tcp`)
# under the same loss.
. "$(dirname "$0")/lib.sh"
need_guests
BIN=$ROOT/${BUILD:-build}/bin
case $BIN in /*) ;; *) BIN=$ROOT/$BIN ;; esac
[ -x "$BIN/shunt-bench" ] && [ -x "$BIN/shunt-bench-scenario" ] || skip "shunt-bench not built"
[ -f "$ROOT/${BUILD:-build}/lib/libshunt.so" ] || skip "libshunt.so not built"
while IFS= read -r v; do
  case $v in SHUNT_FABRIC_*|SHUNT_ROOT|SHUNT_BENCH*) ;; SHUNT_*) unset "$v" ;; esac
done < <(compgen -e)
before=$(ip netns list | grep -c '^sf-sc' || true)
# scenario OUT ARGS...: one scenario run, its output shown and kept in
# $TMP/OUT.out, its files in $TMP/OUT; it must exit 0 and take its fabric down
scenario() {
  local out=$1 rc
  shift
  "$BIN/shunt-bench" scenario "$@" --out "$TMP/$out" >"$TMP/$out.out" 2>&1
  rc=$?
  cat "$TMP/$out.out"
  [ $rc = 0 ] || fail "scenario $* exited $rc"
  [ "$(ip netns list | grep -c '^sf-sc' || true)" = "$before" ] || fail "scenario $* left its fabric behind"
}
scenario sc blackhole --link l1r0-s1 --duration 16 --fault-at 7 --fault-for 4 --stall 20 --retry-cnt 7 --qp-timeout 16
for row in "exit status" "errors seen by the app" "bytes wrong" "GB/s before the fault" "GB/s during the fault" \
  "GB/s after healing" "time to recover" "longest zero-throughput"; do
  grep -q "^$row " "$TMP/sc.out" || fail "row '$row' missing"
done
head -c 8 "$TMP/sc/blackhole.png" | od -An -c | grep -q 'P   N   G' || fail "no plot"
python3 - "$TMP/sc" <<'PY' || fail "scenario results"
import json, sys
d = sys.argv[1]
for mode in ("without", "with"):
    j = json.load(open(f"{d}/{mode}.json"))
    labels = [m["label"] for m in j["marks"]]
    assert labels == ["blackhole", "healed"], labels
    down, healed = (m["t"] for m in j["marks"])
    assert 0 < down < healed < 30, (down, healed)
    assert len(j["timeline"]["samples"]) > 20
    if j["error"] is None:
        assert j["wrong_total"] == 0, j["wrong_total"]
    if mode == "with":
        assert j["error"] is None and j["errors"] == 0, (j["error"], j["errors"])
s = json.load(open(f"{d}/summary.json"))
w = s["with"]
assert s["scenario"] == "blackhole" and "time to recover" in w
assert w["exit status"] == "0" and w["errors seen by the app"] == "0", w
assert int(w["paths down by probes"]) >= 1, w
print("ok:", w["paths down by probes"], "paths found down by their lost probes; the first path down after",
      w["path down after"], "by", w["path found down by"])
PY

# An unchanged perftest client (--client ib_write_bw, rdma_cm) while h1's
# rail-0 link goes dark for good: without libshunt it fails (retry count
# exceeded); with it, the transfer moves to other paths (a path found down,
# its WRs replayed), and the program ends cleanly, having seen no error:
# its rdma_disconnect, whose request to the peer cannot get through the dead
# link, gets its DISCONNECTED event from shunt at once instead of after the
# connection manager's retries (a minute; the run's time limit ended it).
# (ACK timeout exponent 14, as this part was set up with: 0.5 s of retries,
# not the scenario's default 7.5 s, so the run without libshunt fails early.)
scenario wbw link-down --client ib_write_bw --size 64K --duration 20 --fault-at 5 --fault-for 0 --stall 10 --qp-timeout 14
python3 - "$TMP/wbw" <<'PY' || fail "ib_write_bw scenario results"
import json, sys
s = json.load(open(f"{sys.argv[1]}/summary.json"))
wo, w = s["without"], s["with"]
assert wo["exit status"] != "0", wo
assert w["exit status"] == "0" and w["errors seen by the app"] == "0", w
assert w["result"].endswith("MB/s (BW average)"), w["result"]
assert w["path down after"] != "-" and int(w["bytes replayed"]) > 0, w
assert int(w["paths down by probes"]) >= 1, w  # the dark link's idle paths are found by their probes
print("ib_write_bw with rail 0 lost for good: without exit", wo["exit status"], "; with", w["result"])
PY
grep -q '"event":"cm_disconnected"' "$TMP/wbw/with.events0.jsonl" || fail "ib_write_bw: no DISCONNECTED from shunt"

# fi_pingpong (libfabric verbs over rdma_cm, plus its own TCP control
# connection) while h1's rail-0 link is lost for good: without libshunt it
# hangs on both; with it, the verbs traffic moves to the other rail and the
# TCP connection, opened as MPTCP with a subflow on every rail (the rails
# behind the RoCE ports, by default), goes on over rail 1: every round trip
# is made.
# 5000 round trips: on a fast host 2000 of them (about 1 ms each) were over
# before the fault came, 3 s after the connection was up. --duration only
# bounds fi_pingpong's run here (that, --stall and 30 s: 275 s); nothing is
# timed, as a round trip's time varies twentyfold with the host: with
# libshunt 5000 took 18 s on a fast host, and 146 s on two cores with a busy
# loop beside the guests (12 ms a round trip before the fault, about twice
# that after it), which the former bound of 65 s cut short.
scenario fi link-down --client fi_pingpong --pings 5000 --duration 240 --fault-at 3 --fault-for 0 --stall 5
python3 - "$TMP/fi" <<'PY' || { tail -n 8 "$TMP/fi/with.client.out" "$TMP/fi/with.server.out"; fail "fi_pingpong scenario results"; }
import json, sys
s = json.load(open(f"{sys.argv[1]}/summary.json"))
wo, w = s["without"], s["with"]
assert wo["exit status"] != "0", wo
assert w["exit status"] == "0" and w["errors seen by the app"] == "0", w
assert w["result"].startswith("5k round trips"), w["result"]  # all 5000 made
assert w["path down after"] != "-", w
PY

# The benchmark over TCP while h1's rail-0 link is lost for good: without
# libshunt the transfers stop (its stall timeout ends the run); with it, the
# sockets are MPTCP with a subflow on each rail found behind the RoCE ports,
# and the all-to-all goes on over rail 1 with no error and every byte right.
scenario tcp link-down --transport tcp --size 256K --duration 14 --fault-at 4 --fault-for 0 --stall 8
python3 - "$TMP/tcp" <<'PY' || fail "tcp scenario results"
import json, sys
s = json.load(open(f"{sys.argv[1]}/summary.json"))
wo, w = s["without"], s["with"]
assert wo["exit status"] != "0", wo
assert w["exit status"] == "0" and w["errors seen by the app"] == "0" and w["bytes wrong"] == "0", w
assert w["GB/s during the fault"] not in ("-", "0.000"), w
print("tcp with rail 0 lost for good: without", wo["time to recover"], "; with, recovered in", w["time to recover"])
PY
echo ok
