#!/usr/bin/env bash
# timeout: 150
# Fuzzes the probe parser (libFuzzer, ASan+UBSan) for a million inputs.
set -u
cd "$(dirname "$0")/../.."
command -v clang++ >/dev/null || { echo "clang++ not installed"; exit 77; }
B=${BUILD:-build}
make -s BUILD="$B" "$B/fuzz/probe_parser_fuzz" || exit 1
corpus=$(mktemp -d /tmp/probe-fuzz.XXXXXX)
trap 'rm -rf "$corpus"' EXIT
"$B/fuzz/probe_parser_fuzz" -runs=1000000 -max_len=400 -max_total_time=100 "$corpus" 2>&1 | tail -n 4
rc=${PIPESTATUS[0]}
exit $rc
