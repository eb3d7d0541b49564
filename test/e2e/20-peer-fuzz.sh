#!/usr/bin/env bash
# Fuzzes the peer channel's frame parser, session state machines and,
# behind an authenticated session, its real request handlers (libFuzzer,
# ASan+UBSan), 30000 inputs from the seed corpus in the repo: no crash,
# leak, undefined behaviour or trap. (The million-input runs are longer
# than a test: make fuzz-peer, then the binary with -runs=1000000.)
# timeout: 400
. "$(dirname "$0")/../lib.sh"
command -v clang++ >/dev/null || fail "clang++ missing (make deps installs it)"
make -s -C "$ROOT" "${BUILD:-build}/fuzz/peer_session_fuzz" || fail "fuzz target did not build"
mkdir -p "$TMP/corpus"
"$B/fuzz/peer_session_fuzz" -runs=30000 -max_len=2048 "$TMP/corpus" \
  "$ROOT/test/fuzz/corpus/peer_session_fuzz" > "$TMP/log" 2>&1
rc=$?
tail -n 3 "$TMP/log"
[ $rc = 0 ] || fail "fuzzer found a problem: $(grep -m1 -E 'ERROR|SUMMARY' "$TMP/log")"
runs=$(grep -o 'Done [0-9]* runs' "$TMP/log" | grep -o '[0-9]*')
ok "${runs:-?} inputs"
[ "${runs:-0}" -ge 30000 ] || fail "only ${runs:-0} inputs"
