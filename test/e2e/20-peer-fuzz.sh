#!/usr/bin/env bash
# Fuzzes the peer channel's frame parser, session state machines and,
# behind an authenticated session, its real request handlers (libFuzzer,
# ASan+UBSan), 30000 inputs from the seed corpus in the repo: no crash,
# leak, undefined behaviour or trap. (The million-input runs are longer
# than a test: make fuzz-peer, then the binary with -runs=1000000.)
# timeout: 400
. "$(dirname "$0")/../lib.sh"
fuzz peer_session_fuzz 30000
