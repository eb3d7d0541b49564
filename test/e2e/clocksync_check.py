#!/usr/bin/env python3
"""Checks shunt-probe JSON results against the injected test clocks.

Usage: clocksync_check.py [--settle S] [--dead-within MS --dead-at KERNEL_NS --dead-peer NAME
       --dead-rail R] FILE.json...
Every host's estimate of every peer at the end must lie within its bound of
the truth (the test clocks are pure functions of the shared kernel clock).
An estimator reports its model invalid for a moment whenever samples suggest
a step that the next ones must confirm, so where the final snapshot is
invalid the newest valid estimate of the last --final-window seconds stands
for it, unless that one is off by more than its bound: then the estimator
withdrew it rightly (the step came while the pair had no samples) and no
claim stands at the end. Every pair's estimates after --settle must be valid
at least --min-valid of the time, and --min-within of the valid ones within
their bound.
Prints error statistics of the time series after --settle seconds.
"""
import argparse, json, math, sys


def local(spec, t):
    """The test clock minus the kernel clock at kernel time t (exact ints first:
    a double cannot hold ns since the epoch to the ns)."""
    e = t - spec["epoch_ns"]
    out = spec["offset_ns"] + e * spec["drift_ppb"] // 10**9
    es = e * 1e-9
    if spec["wander_ns"]:
        out += spec["wander_ns"] * math.sin(2 * math.pi * es / spec["wander_period_s"])
    if spec["step_ns"] and spec["step_every_s"] > 0:
        out += spec["step_ns"] * math.floor(es / spec["step_every_s"])
    return out


def truth(specs, me, peer, t):
    return local(specs[peer], t) - local(specs[me], t)


def quant(v, q):
    v = sorted(v)
    return v[int(q * (len(v) - 1))] if v else float("nan")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("files", nargs="+")
    ap.add_argument("--settle", type=float, default=5)
    ap.add_argument("--dead-at", type=int, default=0)
    ap.add_argument("--dead-peer", default="")
    ap.add_argument("--dead-rail", type=int, default=-1)
    ap.add_argument("--dead-within-ms", type=float, default=0)
    ap.add_argument("--min-within", type=float, default=0.95)
    ap.add_argument("--min-valid", type=float, default=0.5)
    ap.add_argument("--final-window", type=float, default=1.0)
    a = ap.parse_args()
    res = [json.load(open(f)) for f in a.files]
    specs = {r["name"]: r["test_clock"] for r in res}
    ok = True
    errs, naive, bounds, within, total = [], [], [], 0, 0
    print(f"{'host':>6} {'peer':>6} {'estimate ns':>14} {'truth ns':>14} {'error ns':>9} {'bound ns':>9}")
    for r in res:
        me = r["name"]
        for p in r["peers"]:
            if p["name"] not in specs:
                continue
            series = r["series"].get(p["name"], [])
            at, valid, off, bnd, note = p["at_kernel_ns"], p["valid"], p["offset_ns"], p["bound_ns"], ""
            suspect = False
            if not valid:
                late = [s for s in series if s[1] and (at - s[0]) * 1e-9 <= a.final_window]
                if late:
                    at, valid, off, bnd = late[-1][0], True, late[-1][2], late[-1][3]
                    note = f"   (final snapshot invalid: the estimate {(p['at_kernel_ns'] - at) / 1e6:.0f} ms before)"
                    suspect = True
            tr = truth(specs, me, p["name"], at)
            err = off - tr
            good = valid and abs(err) <= bnd
            if suspect and not good:
                # The estimator withdrew that estimate: it suspects a step (one
                # that came while the pair had no samples, which no holdover
                # can see). No claim stands at the end; the series checks
                # below still count the estimate.
                good = True
                note += ", withdrawn since (a suspected step)"
            ok &= good
            print(f"{me:>6} {p['name']:>6} {off:14.1f} {tr:14.1f} {err:9.1f} {bnd:9.1f}"
                  + ("" if good else "   <-- " + ("outside bound" if valid else "no valid estimate")) + note)
            n_after = n_valid = 0
            for s in series:
                k, valid, off, bnd, nv, noff = s[:6]
                if (k - r["start_kernel_ns"]) * 1e-9 < a.settle:
                    continue
                n_after += 1
                n_valid += bool(valid)
                t = truth(specs, me, p["name"], k)
                if valid:
                    errs.append(abs(off - t))
                    bounds.append(bnd)
                    total += 1
                    within += abs(off - t) <= bnd
                if nv:
                    naive.append(abs(noff - t))
            if n_after and n_valid / n_after < a.min_valid:
                print(f"FAIL: {me}'s estimate of {p['name']} valid only {100 * n_valid / n_after:.0f}% of the time"
                      f" after {a.settle}s (limit {100 * a.min_valid:.0f}%)")
                ok = False
    if errs:
        frac = within / total
        print(f"series after {a.settle}s: |error| p50 {quant(errs, .5):.0f} p99 {quant(errs, .99):.0f} "
              f"max {max(errs):.0f} ns; bound p50 {quant(bounds, .5):.0f} ns; within bound {100 * frac:.1f}%; "
              f"naive |error| p50 {quant(naive, .5):.0f} p99 {quant(naive, .99):.0f} ns")
        if frac < a.min_within:
            print(f"FAIL: only {100 * frac:.1f}% of estimates within their bound")
            ok = False
    if a.dead_within_ms:
        for r in res:
            if r["name"] == a.dead_peer:
                continue
            ev = [e for e in r["events"] if e["peer"] == a.dead_peer and e["path"] == a.dead_rail
                  and not e["alive"] and e["kernel_ns"] >= a.dead_at]
            if not ev:
                print(f"FAIL: {r['name']} never declared {a.dead_peer} rail {a.dead_rail} dead")
                ok = False
                continue
            ms = (ev[0]["kernel_ns"] - a.dead_at) / 1e6
            good = ms <= a.dead_within_ms
            ok &= good
            print(f"{r['name']}: {a.dead_peer} rail {a.dead_rail} dead after {ms:.0f} ms"
                  + ("" if good else f" (limit {a.dead_within_ms:.0f} ms)"))
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
