#!/usr/bin/env bash
# Fuzzes the peer channel's frame parser and session state machines
# (libFuzzer, ASan+UBSan) for a million inputs.
# timeout: 240
. "$(dirname "$0")/../lib.sh"
command -v clang++ >/dev/null || fail "clang++ missing (make deps installs it)"
make -s -C "$ROOT" "${BUILD:-build}/fuzz/peer_session_fuzz" || fail "fuzz target did not build"
mkdir -p "$TMP/corpus"
"$B/fuzz/peer_session_fuzz" -runs=1000000 -max_len=2048 -max_total_time=200 "$TMP/corpus" > "$TMP/log" 2>&1
rc=$?
tail -n 3 "$TMP/log"
[ $rc = 0 ] || fail "fuzzer found a problem: $(grep -m1 -E 'ERROR|SUMMARY' "$TMP/log")"
runs=$(grep -o 'Done [0-9]* runs' "$TMP/log" | grep -o '[0-9]*')
ok "${runs:-?} inputs"
[ "${runs:-0}" -ge 1000000 ] || fail "only ${runs:-0} inputs in the time allowed"
