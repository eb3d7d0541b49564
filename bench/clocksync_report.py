#!/usr/bin/env python3
"""Table for bench/clocksync.sh from the shunt-probe JSON files (and chrony's
statistics log). Errors are against the injected test clocks."""
import argparse, glob, json, math, os, sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "test", "e2e"))
from clocksync_check import local  # noqa: E402


def q(v, p):
    v = sorted(v)
    return v[int(p * (len(v) - 1))] if v else float("nan")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("files", nargs="+")
    ap.add_argument("--holdover-at", type=float, required=True)
    ap.add_argument("--chrony", default="none")
    ap.add_argument("--settle", type=float, default=5)
    ap.add_argument("--cpu-target", type=float, default=2, help="%% of one core per host")
    a = ap.parse_args()
    res = [json.load(open(f)) for f in a.files]
    specs = {r["name"]: r["test_clock"] for r in res}
    tr = lambda me, p, t: local(specs[p], t) - local(specs[me], t)
    shunt, naive, conv, drift_err, hold = [], [], [], [], []
    for r in res:
        me, t0 = r["name"], r["start_kernel_ns"]
        hstart = r["holdover_start_kernel_ns"]
        for p in r["peers"]:
            ser = r["series"].get(p["name"], [])
            first_ok = None
            for k, valid, off, bnd, nv, noff, *_ in ser:
                el = (k - t0) * 1e-9
                t = tr(me, p["name"], k)
                in_hold = hstart and k >= hstart
                if valid and not in_hold:
                    e = abs(off - t)
                    if el >= a.settle:
                        shunt.append(e)
                    if e <= 1000 and first_ok is None:
                        first_ok = el
                    elif e > 1000 and el < a.settle:
                        first_ok = None
                if nv and not in_hold and el >= a.settle:
                    naive.append(abs(noff - t))
            if first_ok is not None:
                conv.append(first_ok)
            # Drift: the model's at the end vs the truth's slope over the last second.
            k = p["at_kernel_ns"]
            true_drift = (tr(me, p["name"], k) - tr(me, p["name"], k - 10**9))  # ns per s = ppb
            drift_err.append(abs(p["drift_ppb"] - true_drift))
            if hstart and p["valid"]:
                hold.append((abs(p["offset_ns"] - tr(me, p["name"], k)), (k - hstart) * 1e-9, p["bound_ns"]))
    secs = max(r["duration_s"] for r in res)
    npeers = len(res[0]["peers"])
    bytes_s = [r["counters"]["bytes_sent"] / r["duration_s"] / len(r["peers"]) for r in res]
    cpu = [100 * r["cpu_s"] / r["duration_s"] for r in res]
    print(f"clocksync bench: {len(res)} hosts x {len(res[0]['peers'][0]['paths'])} rails, "
          f"{res[0]['stamp_mode']} timestamps, {secs:.0f} s, cross traffic on rail 0, "
          f"probe interval {res[0]['interval_ms']} ms")
    print(f"{'estimator':<10} {'p50 ns':>9} {'p99 ns':>9} {'max ns':>10} {'samples':>8}")
    print(f"{'shunt':<10} {q(shunt, .5):9.0f} {q(shunt, .99):9.0f} {max(shunt):10.0f} {len(shunt):8d}")
    print(f"{'naive':<10} {q(naive, .5):9.0f} {q(naive, .99):9.0f} {max(naive):10.0f} {len(naive):8d}")
    if a.chrony != "none":
        est = []
        for f in glob.glob(os.path.join(a.chrony, "statistics.log")):
            for line in open(f):
                w = line.split()
                if len(w) > 5 and w[0][0].isdigit() and w[2].count(".") == 3:
                    try:
                        est.append(abs(float(w[4])) * 1e9)  # "Est offset", seconds; truth 0
                    except ValueError:
                        pass
        est = est[len(est) // 4:]  # after its own settling
        if est:
            print(f"{'chrony':<10} {q(est, .5):9.0f} {q(est, .99):9.0f} {max(est):10.0f} {len(est):8d}"
                  "   (statistics.log 'Est offset', truth 0)")
        else:
            print("chrony     no estimates logged")
    else:
        print("chrony     not installed (apt-get install chrony) - row skipped")
    ratio = q(naive, .99) / q(shunt, .99) if shunt else float("nan")
    print(f"shunt vs naive p99: {ratio:.0f}x better")
    print(f"drift error (ppb): p50 {q(drift_err, .5):.1f} max {max(drift_err):.1f}")
    print(f"convergence to 1 us (s from start): p50 {q(conv, .5):.1f} max {max(conv) if conv else float('nan'):.1f}")
    if hold:
        he = [h[0] for h in hold]
        print(f"holdover error after {hold[0][1]:.1f} s without probes: p50 {q(he, .5):.0f} ns, "
              f"max {max(he):.0f} ns (bound p50 {q([h[2] for h in hold], .5):.0f} ns); "
              f"within bound {sum(h[0] <= h[2] for h in hold)}/{len(hold)}")
    link = 100e9 / 8
    print(f"probe cost: {q(bytes_s, .5):.0f} B/s per peer ({100 * q(bytes_s, .5) / link:.6f}% of 100 Gb/s), "
          f"{q(bytes_s, .5) * npeers:.0f} B/s per host with {npeers} peers")
    # user+sys CPU seconds of the whole shunt-probe process (engine and the
    # runner's 10 Hz reporting) per wall second, per host.
    verdict = "met" if max(cpu) <= a.cpu_target else "NOT met"
    print(f"probe CPU: {q(cpu, .5) / 100:.4f} s per s per host (user+sys), {q(cpu, .5):.2f}% of one core "
          f"(max {max(cpu):.2f}%); target <= {a.cpu_target:g}%: {verdict}")


if __name__ == "__main__":
    main()
