#!/usr/bin/env bash
# Failover on the fabric, per fault: `shunt-bench scenario` (2 ranks,
# verbs all-to-all write_imm, -c 1; each scenario on a fresh 2-host,
# 2-rail, 2-spine fabric of soft-RoCE guests), without and with libshunt
# side by side. The faults (see shunt-bench(1)):
#   link-down 20 s  h1's rail-0 link goes silently dark for 20 s, then up
#   link-down       the same, for good
#   port-down 20 s  h1's rail-0 port loses its carrier (port event), then up
#   flap 30 s       h1's rail-0 link down and up every 500 ms for 30 s
#   spine 20 s      every link on rails 0 and 1 of the spine that carried
#                   h1's rail-0 traffic just before drops everything
#   nic-remove      h1's rail-0 NIC falls off the bus (rail lost for good)
#   two-rails 20 s  h1's leaves lose their uplink to that spine on both
#                   rails at once
#   cascade 20 s    h1's rail-0 leaf loses its uplink to that spine, then
#                   0.7 s later (a failover under way) the one to the other
# The healed faults last 20 s: an rdma_cm QP (perftest -R, fi_pingpong)
# has a ~2 s ACK timeout, so its 7 tries ride out a shorter outage without
# libshunt, and the fault is placed on the spine its traffic crosses (a
# QP hashed to the other spine would not notice).
# fi_pingpong's QPs retry forever on rdma_rxe (retry count 7), so without
# libshunt a healed fault only stalls it: compare how long it ran.
# Reported per fault: how the run without libshunt ended; with it: exit,
# errors the application saw, bytes wrong, how long until a path was found
# down, until the first completion after the fault, until the throughput of
# the last second was back to 90% of before, bytes shunt replayed, how long
# after healing every failed path was back in service (failback), and the
# throughput before, during and after the fault.
# FAILOVER_BENCH_ONLY="port-down nic-remove" runs some of them;
# FAILOVER_BENCH_CLIENTS="alltoall sendrecv ib_write_bw ib_send_bw
# fi_pingpong" runs each fault under each of those programs (default
# alltoall; the others are judged by exit status and what they print).
# The runs with libshunt probe every path, the application's QPs' own
# included (the scenario's default: a probe engine on the rails each host
# finds behind its RoCE ports), as a cluster running shunt would;
# FAILOVER_BENCH_PROBES=0 (scenario --no-probes) leaves detection to
# completions, port events and the stall watch.
set -u
cd "$(dirname "$0")/.."
B=${BUILD:-build}
case $B in /*) ;; *) B=$PWD/$B ;; esac
export SHUNT_FABRIC_GUEST=${SHUNT_FABRIC_GUEST:-$B/guest}
out=$B/bench/failover
rm -rf "$out"
mkdir -p "$out"
# tag | scenario and its options
cases=(
  "link-down-20s|link-down --fault-for 20 --duration 40"
  "link-down-for-good|link-down --fault-for 0 --duration 30"
  "port-down-20s|port-down --fault-for 20 --duration 40"
  "flap-30s|flap --flap-ms 500 --fault-for 30 --duration 50"
  "spine-20s|spine --fault-for 20 --duration 40"
  "nic-remove|nic-remove --duration 30"
  "two-rails-20s|two-rails --fault-for 20 --duration 40"
  "cascade-20s|cascade --fault-for 20 --duration 40"
)
rc=0 ran=()
for client in ${FAILOVER_BENCH_CLIENTS:-alltoall}; do
for c in "${cases[@]}"; do
  tag=${c%%|*} args=${c#*|}
  if [ -n "${FAILOVER_BENCH_ONLY:-}" ]; then
    case " $FAILOVER_BENCH_ONLY " in *" ${args%% *} "*|*" $tag "*) ;; *) continue ;; esac
  fi
  [ "$client" = alltoall ] || tag=$client:$tag
  extra=()
  [ "${FAILOVER_BENCH_PROBES:-1}" = 0 ] && extra=(--no-probes)
  case $client in ib_*) extra+=(--size 64K) ;; esac
  echo "--- $tag: shunt-bench scenario $args --client $client"
  # shellcheck disable=SC2086
  "$B/bin/shunt-bench" scenario $args --client "$client" "${extra[@]}" --fault-at 8 --out "$out/$tag" > "$out/$tag.log" 2>&1
  x=$?
  [ $x = 77 ] && { tail -1 "$out/$tag.log"; exit 0; }
  [ $x = 0 ] || { cat "$out/$tag.log"; rc=1; continue; }
  ran+=("$tag")
done
done
[ ${#ran[@]} -gt 0 ] || exit $rc
python3 - "$out" "${ran[@]}" <<'PY'
import json, sys
out, tags = sys.argv[1], sys.argv[2:]
def short(s, n):
    s = str(s)
    return s if len(s) <= n else s[: n - 1] + "~"
def ran(r):  # perftest and fi_pingpong: how long the client ran (a stall shows there)
    return ", ran %s" % r["client ran for"] if "client ran for" in r else ""
cols = [("without: ended", lambda w, s: "exit %s, %s err%s" % (w["exit status"], w["errors seen by the app"], ran(w))),
        ("with: ended", lambda w, s: "exit %s, %s err, %s wrong%s" % (s["exit status"], s["errors seen by the app"],
                                                                      s.get("bytes wrong", "-"), ran(s))),
        ("path down", lambda w, s: s.get("path down after", "-")),
        ("1st completion", lambda w, s: s.get("first completion after", "-")),
        (">=90% after", lambda w, s: s.get("time to recover", "-")),
        ("replayed B", lambda w, s: s.get("bytes replayed", "-")),
        ("failback", lambda w, s: "none" if str(s.get("failback after healing", "")).startswith("none")
                                  else s.get("failback after healing", "-")),
        ("GB/s before/during/after", lambda w, s: "%s/%s/%s" % (s["GB/s before the fault"], s["GB/s during the fault"],
                                                               s["GB/s after healing"]) if "GB/s during the fault" in s
                                                   else s.get("result", "-"))]
widths = [31, 32, 38, 10, 14, 12, 11, 9, 24]
print("".join(h.ljust(w) for h, w in zip(["fault"] + [c[0] for c in cols], widths)))
for t in tags:
    try:
        s = json.load(open(f"{out}/{t}/summary.json"))
    except (OSError, ValueError):
        print(t.ljust(widths[0]) + "no summary")
        continue
    cells = [t] + [f(s["without"], s["with"]) for _, f in cols]
    print("".join(short(c, w - 1).ljust(w) for c, w in zip(cells, widths)))
print(f"(plots and per-run data under {out}/)")
PY
exit $rc
