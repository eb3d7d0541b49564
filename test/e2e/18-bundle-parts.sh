#!/usr/bin/env bash
# The bundle's parts (interpose/verbs/bundle/) stay layers: each file calls
# only the parts that parts.h lists before it (its two exceptions are
# worker.cc's wake_worker and start_job, named there), every function
# parts.h offers has one owner, every thread of the bundle starts in
# worker.cc, only its events (events.cc) log or make telemetry events, and
# no file of the bundle is over 600 lines.
# timeout: 30
. "$(dirname "$0")/../lib.sh"
python3 - "$ROOT/interpose/verbs/bundle" <<'PY' || fail "the bundle's parts call up their layers (above)"
import os, re, sys
d = sys.argv[1]
parts = open(os.path.join(d, "parts.h")).read()
order, owner, cur = [], {}, None
for line in parts.split("\n"):
    m = re.match(r"// ---- (\w+)\.cc$", line)
    if m:
        cur = m.group(1)
        order.append(cur)
        continue
    if line.startswith("// ----"):
        cur = None
        continue
    m = re.match(r"^(?:extern )?[\w:<>,\s\*&]+?[\s\*&](\w+)(?:\(|;)", line)
    if cur and m:
        if m.group(1) in owner and owner[m.group(1)] != cur:
            print("two owners:", m.group(1), owner[m.group(1)], cur)
            sys.exit(1)
        owner[m.group(1)] = cur
top = ["lifecycle", "datapath", "api"]  # they offer only bundle.h
layers = order + top
# life.cc and move.cc: pure transition functions, below every part (state.h
# includes their headers); they call none.
files = sorted(f[:-3] for f in os.listdir(d) if f.endswith(".cc") and f not in ("life.cc", "move.cc"))
missing = [f for f in files if f not in layers]
if missing:
    print("not in parts.h's order:", missing)
    sys.exit(1)
def code(path):
    s = open(path).read()
    s = re.sub(r'"(\\.|[^"\\])*"', '""', s)
    return re.sub(r"//.*", "", s)
bad = 0
for f in files:
    text = code(os.path.join(d, f + ".cc"))
    for name, o in owner.items():
        if o == f or layers.index(o) < layers.index(f) or name in ("wake_worker", "start_job"):
            continue
        if re.search(r"(?<![\w.>])" + name + r"\s*\(", text):
            print(f"{f}.cc calls {name} ({o}.cc), a later part")
            bad += 1
# Every file of the folder: 600 lines at most; threads start only in
# worker.cc (core's start_thread, a std::thread); what the bundle says goes
# through its events: no other file logs, makes a telemetry event or
# includes the logging headers.
events = [f for f in files if f == "events" or f.startswith("events_")]
only_events = ", ".join(e + ".cc" for e in events)
said = [0, 0]  # log sites, telemetry events
for root, _, names in os.walk(d):
    for name in sorted(names):
        f = os.path.relpath(os.path.join(root, name), d)
        path = os.path.join(d, f)
        raw = open(path).read()
        n = len(raw.splitlines())
        if n > 600:
            print(f"{f}: {n} lines (600 at most)")
            bad += 1
        if not f.endswith((".cc", ".h")):
            continue
        text = code(path)
        if f != "worker.cc" and re.search(r"(?<![\w.>])start_thread\s*\(|std::(thread|jthread)\b|pthread_create", text):
            print(f"{f} starts a thread (only worker.cc does)")
            bad += 1
        if not f.endswith(".cc"):
            continue
        logs, evs = len(re.findall(r"\blog::", text)), len(re.findall(r"\btelemetry::event\s*\(", text))
        if f[:-3] in events:
            said = [said[0] + logs, said[1] + evs]
            continue
        if logs + evs:
            print(f"{f} logs or makes events ({logs + evs} site{'s' if logs + evs > 1 else ''}): only {only_events} may")
            bad += 1
        for h in re.findall(r'#include "(core/(?:event_)?log\.h)"', raw):
            print(f"{f} includes {h}: only {only_events} may")
            bad += 1
if not events or not said[0]:
    print("no events file that logs")
    bad += 1
print(f"{len(files)} parts, {len(owner)} functions offered, layers: {' < '.join(layers)}")
print(f"{said[0]} log sites and {said[1]} telemetry events, all in {only_events}")
sys.exit(1 if bad else 0)
PY
ok "the bundle's parts call only the layers before them, and only its events log"
