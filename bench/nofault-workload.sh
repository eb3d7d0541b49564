# shellcheck shell=bash
# Sourced by bench/nofault.sh and bench/guest-profile.sh: the no-fault
# workload they share, so that a profile is of the run the ratio is of.
# nofault_args HOSTS DURATION PORT: shunt-bench's arguments (besides
# --rank) for a HOSTS-rank verbs all-to-all of 1 MiB in 64 KiB
# WRITE_WITH_IMMs, -c 1, for DURATION s, bootstrapped on h1 at PORT, with
# a timeline row a second; in the array NOFAULT_ARGS.
nofault_args() {
  # shellcheck disable=SC2034 # read by the scripts that source this
  NOFAULT_ARGS=(--world "$1" --bootstrap "$(fab addr h1 r0):$3" --transport verbs --verb write_imm -d rxe0
    -b 1M -e 1M -w 2 --duration "$2" -c 1 --seg 64K --stall-timeout 60 --qp-timeout 18 --timeline 1000)
}
# steady_mbs FROM FILE: what a rank received per second (MB/s) over its
# timeline rows after FROM s (#T wall(s) t(s) bytes GB/s errors); nothing
# when there are none.
steady_mbs() {
  awk -v from="$1" '$1 == "#T" && $3 ~ /^[0-9.]+$/ && $3 > from { b += $4; n++ }
    END { if (n) printf "%.3f\n", b / n / 1e6 }' "$2"
}
