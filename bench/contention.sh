#!/usr/bin/env bash
# Two all-to-all jobs colliding on rate-limited spines (the traffic-control
# issue's scenario): `shunt-bench scenario contention` with its defaults
# (both jobs on two guests, 10 Mbit/s spines, every mode, then job A alone
# with each split mode). Prints the scenario's table: each job against its
# max-min fair share of payload, the sum against the collided run without
# libshunt, steering steps per bundle per second, and steering against
# static shares where nothing collides. CONTENTION_BENCH_ARGS: more options
# of the scenario (e.g. "--hosts 4 --modes queue").
set -u
cd "$(dirname "$0")/.."
B=${BUILD:-build}
case $B in /*) ;; *) B=$PWD/$B ;; esac
export SHUNT_FABRIC_GUEST=${SHUNT_FABRIC_GUEST:-$B/guest}
out=$B/bench/contention
rm -rf "$out"
mkdir -p "$out"
# shellcheck disable=SC2086
SHUNT_ROOT=$PWD BUILD=${BUILD:-build} "$B/bin/shunt-bench" scenario contention --out "$out" ${CONTENTION_BENCH_ARGS:-} > "$out/log" 2>&1
x=$?
[ $x = 77 ] && { tail -1 "$out/log"; exit 0; }
cat "$out/log"
exit $x
