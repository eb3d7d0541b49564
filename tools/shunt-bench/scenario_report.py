#!/usr/bin/env python3
"""The side-by-side report of `shunt-bench scenario NAME` (scenario.sh).

Usage: scenario_report.py OUT NAME CLIENT
  OUT     the scenario's results directory (--out)
  NAME    the scenario (link-down, blackhole, ...): the fault's mark label
  CLIENT  alltoall or sendrecv (shunt-bench, judged by its timeline), or
          ib_write_bw, ib_send_bw, fi_pingpong (an unchanged program,
          judged by its exit status and what it prints)

Reads, for each run MODE (without, with) in OUT: MODE.rc (exit status),
MODE.json (shunt-bench's result with its timeline and the fault's marks),
MODE.rank*.out (the ranks' output), MODE.spine (the faulted spine, where
one was picked), for an unchanged program MODE.client.out,
MODE.server.out and MODE.ran (the client's wall time), and for the run
with libshunt with.stats*.json, with.events*.jsonl and (unchanged
programs) with.marks.

Prints the table of both runs (a blank line first), the plot's path
where NAME.png is in OUT, and each run's first error; writes the same
rows to OUT/summary.json.
"""
import json, os, re, sys
out, name, client = sys.argv[1], sys.argv[2], sys.argv[3]
tool = client not in ("alltoall", "sendrecv")

def tool_result(mode):
    """An unchanged program's own report: its error lines (client and
    server) and its result (perftest: BW average MB/s; fi_pingpong: usec
    per transfer)."""
    errs, res = [], None
    for side in ("client", "server"):
        try:
            lines = open(f"{out}/{mode}.{side}.out", errors="replace").read().splitlines()
        except OSError:
            continue
        errs += [l.strip() for l in lines if re.search(r"error|fail|unable|timed? ?out", l, re.I)
                 and not re.search(r" shunt (trace|debug|info|warning|error):", l)]  # shunt's log is no error of the app
        if side != "client":
            continue
        for l in lines:
            f = l.split()
            if client.startswith("ib_") and len(f) >= 5 and f[0].isdigit() and f[1].isdigit():
                res = f"{float(f[3]):.1f} MB/s (BW average)"
            elif client == "fi_pingpong" and len(f) >= 6 and f[0] == "4k":
                res = f"{f[1]} round trips, {f[6]} usec/xfer"
    return errs, res

def load(mode):
    r = {"mode": mode, "rc": "?", "json": None, "err": ""}
    try:
        r["rc"] = open(f"{out}/{mode}.rc").read().strip()
    except OSError:
        pass
    try:
        r["json"] = json.load(open(f"{out}/{mode}.json"))
    except (OSError, ValueError):
        pass
    errs = []
    for f in sorted(os.listdir(out)):
        if f.startswith(mode + ".rank"):
            errs += [l.strip() for l in open(os.path.join(out, f), errors="replace") if "error:" in l]
    if tool:
        errs, r["result"] = tool_result(mode)
        r["errors"] = len(errs)
        try:  # the client's wall time: a healed fault the program rode out shows as a stall
            r["ran"] = float(open(f"{out}/{mode}.ran").read())
        except (OSError, ValueError):
            r["ran"] = None
    try:
        r["spine"] = open(f"{out}/{mode}.spine").read().strip()
    except OSError:
        r["spine"] = None
    # a transport's own error says more than a bootstrap that saw its peer go
    own = [e for e in errs if "bootstrap:" not in e]
    r["err"] = (own or errs or [""])[0]
    return r

def phases(j):
    s = [(x[1], x[3]) for x in j["timeline"]["samples"]]
    marks = {m["label"]: m["t"] for m in j["marks"]}
    fault = marks.get(name)
    healed = marks.get("healed")
    end = s[-1][0] if s else 0
    def mean(a, b):
        v = [g for t, g in s if a < t <= b]
        return sum(v) / len(v) if v else None
    res = {"end": end, "fault": fault, "healed": healed}
    if fault is None:
        return res
    res["before"] = mean(0.3, fault)
    res["during"] = mean(fault, healed if healed is not None else end)
    res["after"] = mean(healed, end) if healed is not None and end > healed else None
    base = res["before"] or 0
    # the first completion after the fault: at once when throughput never
    # stopped (in the 8 s after the fault), else the end of the first zero
    # stretch after the fault
    zero = next((t for t, g in s if fault < t <= fault + 8 and g == 0), None)
    if zero is None:
        res["first"] = 0.0 if s and s[-1][0] > fault else None
    else:
        res["first"] = next((t - fault for t, g in s if t > zero and g > 0), None)
    # time to recover: from the fault until the throughput of the last
    # second is back to 90% of what it was before, once the job completes
    # again (samples jitter: one sample is no measure)
    res["recover"] = None
    if base and res["first"] is not None:
        for t, g in s:
            if t < fault + res["first"] or t < fault:
                continue
            avg = mean(t - 1.0, t)
            if avg is not None and avg >= 0.9 * base:
                res["recover"] = t - fault
                break
    longest = cur = 0.0
    prev = 0.0
    for t, g in s:
        cur = cur + (t - prev) if g == 0 else 0.0
        longest = max(longest, cur)
        prev = t
    res["stall"] = longest
    return res

def shunt_did(j):
    """From the with-run's stats files and event logs (every rank): bytes
    replayed, when the first path went down after the fault, and when the
    last failed path was back after healing (guest epoch seconds)."""
    d = {"replayed": None, "detect": None, "failback": None, "found_by": None}
    rb = 0
    seen = False
    for f in sorted(os.listdir(out)):
        if f.startswith("with.stats"):
            try:
                st = json.load(open(os.path.join(out, f)))
            except (OSError, ValueError):
                continue
            for q in st.get("verbs", {}).get("qps", []):
                b = q.get("bundle")
                if b:
                    seen = True
                    rb += b.get("replayed_bytes", 0)
    if seen:
        d["replayed"] = rb
    if j and "timeline" in j:
        start = j["timeline"].get("start_wall", 0)
        marks = {m["label"]: m["t"] + start for m in j["marks"]}
    elif tool:  # the marks as written (guest epochs)
        marks = {}
        for line in open(f"{out}/with.marks"):
            t, _, label = line.strip().partition(":")
            if t.startswith("@"):
                marks[label] = float(t[1:])
    else:
        return d
    fault, healed = marks.get(name), marks.get("healed")
    # paths of every host found down by their lost probes (no clock needed)
    d["by_probes"] = 0
    for f in sorted(os.listdir(out)):
        if f.startswith("with.events"):
            for line in open(os.path.join(out, f), errors="replace"):
                d["by_probes"] += '"event":"path_down"' in line and '"status":"probes_lost"' in line
    # h1's events only: the marks are on h1's clock, and guests' clocks
    # differ by up to a second (each set from its RTC at boot)
    ev = []
    for f in ["with.events0.jsonl"]:
        if os.path.exists(os.path.join(out, f)):
            for line in open(os.path.join(out, f), errors="replace"):
                try:
                    e = json.loads(line)
                except ValueError:
                    continue
                # a bundle's path (the probe engine's own path_down names no device)
                if "device" in e:
                    ev.append((e.get("wall_ns", 0) / 1e9, e.get("event"), (e.get("qpn"), e.get("path")),
                               e.get("status")))
    by, ev = ev, [x[:3] for x in ev]  # by: with each event's status
    if fault is not None:
        downs = sorted((t, st) for t, e, _, st in by if e == "path_down" and t >= fault - 0.05)
        if downs:
            d["detect"] = downs[0][0] - fault
            # how the first path was found down: by its lost probes, its
            # port's event, a stall, a completion error, or the peer
            d["found_by"] = {"probes_lost": "its lost probes", "port_down": "port event",
                             "stalled": "stall watch", "flapping": "stall watch (flapping)",
                             "unanswered": "unanswered probe", "peer": "the peer"}.get(downs[0][1], f"completion ({downs[0][1]})")
    if healed is not None:
        ups = [t for t, e, _ in ev if e == "path_up" and t >= healed]
        # the shadows still down when the fault was healed (the
        # application's own QP, path -1, is never renewed)
        state = {}
        for t, e, k in sorted(ev, key=lambda x: x[0]):
            if t < healed and e in ("path_down", "path_up") and k[1] != -1:
                state[k] = e
        if ups:
            d["failback"] = max(ups) - healed
        elif not any(e == "path_down" for e in state.values()):
            d["failback"] = "none needed (every path back before healing)"
    return d

runs = [load("without"), load("with")]
def fmt(v, unit="", nd=3):
    return "-" if v is None else f"{v:.{nd}f}{unit}"
rows = []
for r in runs:
    j = r["json"]
    p = phases(j) if j and "timeline" in j else {}
    col = {}
    col["exit status"] = r["rc"]
    if r["spine"]:
        col["fault on spine"] = r["spine"]
    if tool:
        col["errors seen by the app"] = str(r["errors"])
        col["result"] = r["result"] or "none printed"
        col["client ran for"] = fmt(r["ran"], " s", 1)
    elif j:
        col["errors seen by the app"] = str(j["errors"])
        col["bytes wrong"] = "-" if j["wrong_total"] is None else str(j["wrong_total"])
    else:
        col["errors seen by the app"] = "no result"
        col["bytes wrong"] = "-"
    if not tool:  # the timeline of shunt-bench
        col["GB/s before the fault"] = fmt(p.get("before"))
        col["GB/s during the fault"] = fmt(p.get("during"))
        col["GB/s after healing"] = fmt(p.get("after"))
        if p.get("fault") is None:
            col["time to recover"] = "-"
        elif j.get("error"):
            col["time to recover"] = f"never (failed at {p['end']:.1f} s)"
        elif p.get("recover") is not None:
            col["time to recover"] = fmt(p["recover"], " s", 1)
        else:
            col["time to recover"] = f"never (run ended at {p['end']:.1f} s)"
        col["longest zero-throughput"] = fmt(p.get("stall"), " s", 1)
        if p.get("fault") is None or j.get("error"):
            col["first completion after"] = "-"
        else:
            col["first completion after"] = fmt(p.get("first"), " s", 1)
    if r["mode"] == "with":
        d = shunt_did(j)
        col["path down after"] = fmt(d["detect"], " s", 2)
        col["path found down by"] = d["found_by"] or "-"
        col["paths down by probes"] = str(d.get("by_probes", 0))
        col["bytes replayed"] = "-" if d["replayed"] is None else str(d["replayed"])
        fb = d["failback"]
        col["failback after healing"] = fb if isinstance(fb, str) else fmt(fb, " s", 1)
    else:
        col["path down after"] = col["path found down by"] = col["paths down by probes"] = col["bytes replayed"] = col["failback after healing"] = "-"
    rows.append(col)
print()
print(f"{'scenario ' + name:<26} {'without libshunt':<34} {'with libshunt':<34}")
for k in dict.fromkeys(list(rows[0]) + list(rows[1])):
    print(f"{k:<26} {rows[0].get(k, '-'):<34} {rows[1].get(k, '-'):<34}")
if os.path.exists(f"{out}/{name}.png"):
    print(f"{'plot':<26} {out}/{name}.png")
for r in runs:
    print(f"first error {r['mode']} libshunt: {r['err'] or '-'}")
summary = {"scenario": name, "without": dict(rows[0], first_error=runs[0]["err"]),
           "with": dict(rows[1], first_error=runs[1]["err"])}
json.dump(summary, open(f"{out}/summary.json", "w"), indent=1)
