#!/usr/bin/env bash
# The library's folders include only their own layer and the ones below:
#   1 core/  2 peer/  3 clocksync/  4 telemetry/  5 interpose/ (verbs,
#   bundle, socket)  6 agent/, then the interposed entry points
#   (interpose/**/exports.cc, *_exports.cc: only in libshunt.so, they start
#   the agent); tools/, test/, bench/ and examples/ may include anything,
#   and so may a testing/ folder (test hooks). Reads every #include "..."
#   of the library's .cc and .h files; no build needed.
# timeout: 30
. "$(dirname "$0")/../lib.sh"
cd "$ROOT" || fail "no source tree at $ROOT"
python3 - <<'PY'
import os, re, sys

LAYERS = ["core", "peer", "clocksync", "telemetry", "interpose", "agent"]
FREE = ["tools", "test", "bench", "examples"]  # may include anything
ENTRY = len(LAYERS) + 0.5  # the interposed entry points: above the agent
TOP = len(LAYERS) + 1

def layer_of(path):
    top = path.split("/", 1)[0]
    if top in LAYERS:
        return LAYERS.index(top) + 1
    return TOP if top in FREE else None

def name(rank):
    if rank == ENTRY:
        return "an entry point"
    return LAYERS[rank - 1] + "/" if rank <= len(LAYERS) else "tools/test/bench"

bad, files, seen = [], 0, set()
# Every folder with C or C++ sources has a place in the order.
for top in sorted(os.listdir(".")):
    if not os.path.isdir(top) or top.startswith(".") or top.startswith("build") or top in LAYERS + FREE:
        continue
    for d, _, fs in os.walk(top):
        if any(f.endswith((".cc", ".h", ".c")) for f in fs):
            bad.append(f"{top}/ holds sources but is in no layer (add it to the order in test/e2e/18-layers.sh)")
            break
for top in LAYERS:
    if not os.path.isdir(top):
        continue
    for d, subdirs, fs in os.walk(top):
        subdirs.sort()
        if "testing" in d.split("/"):
            continue  # test hooks: test code
        for f in sorted(fs):
            if not f.endswith((".cc", ".h")):
                continue
            path = os.path.join(d, f)
            files += 1
            seen.add(top)
            rank = layer_of(path)
            if f == "exports.cc" or f.endswith("_exports.cc"):
                rank = ENTRY
            for n, line in enumerate(open(path, errors="replace"), 1):
                m = re.match(r'\s*#\s*include\s+"([^"]+)"', line)
                if not m:
                    continue
                inc = m.group(1)
                to = layer_of(inc)
                if to is None:
                    if os.path.exists(os.path.join(d, inc)):
                        continue  # beside the file: its own folder
                    bad.append(f'{path}:{n} includes "{inc}", which is in no layer')
                elif to > rank:
                    bad.append(f'{path}:{n} includes "{inc}": {name(rank)} (layer {rank:g}) may not include {name(to)} (layer {to})')
missing = [t + "/" for t in LAYERS if t not in seen]
if missing:
    bad.insert(0, "no sources under " + ", ".join(missing))
for b in bad:
    print("FAIL: " + b)
if bad:
    sys.exit(1)
print(f"ok: {files} files of {', '.join(LAYERS)} include only their layer and the ones below")
PY
