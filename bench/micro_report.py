"""Prints the hot-path microbenchmark as a table of medians and the cost
each mode adds over the unpatched call, from Google Benchmark's JSON."""
import json
import sys

rows, others = {}, {}
for b in json.load(open(sys.argv[1]))["benchmarks"]:
    if b.get("aggregate_name") != "median":
        continue
    if "/" not in b["run_name"]:  # not a per-call figure (snapshot)
        others[b["run_name"]] = (b["cpu_time"], b.get("time_unit", "ns"))
        continue
    call, mode = b["run_name"].split("/")
    rows.setdefault(call, {})[mode] = b["cpu_time"]

targets = {"off": 2.0, "observe": 10.0, "active_bundle": 20.0}
print(f"{'call':10} {'mode':14} {'ns':>8} {'added ns':>9} {'target':>8}")
for call, modes in rows.items():
    base = modes["unpatched"]
    for mode in ("unpatched", "off", "observe", "active_bundle"):
        if mode not in modes:
            continue
        added = modes[mode] - base
        tgt = f"<= {targets[mode]:.0f}" if mode in targets else ""
        print(f"{call:10} {mode:14} {modes[mode]:8.2f} {added:+9.2f} {tgt:>8}")
for name, (t, unit) in others.items():
    print(f"{name}: {t:.1f} {unit} of CPU (median)")
