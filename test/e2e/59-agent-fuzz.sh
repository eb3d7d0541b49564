#!/usr/bin/env bash
# Fuzzes the host agent's control socket (its real handler, every builtin
# command registered, as root and as another user), the metrics endpoint's
# HTTP server and the settings (environment and config file through
# load_config) with libFuzzer under ASan and UBSan: 30000 inputs from the
# seed corpus in the repo, no crash, leak, undefined behaviour, trap or
# broken answer (a control answer that is not one line of JSON, a whole
# request head not answered in HTTP/1.0, a settings error that is not one
# printable line naming its variable, a bad setting that left the library
# on). The target moves into a network namespace of its own (route-hops
# sends datagrams to the addresses it is given). The million-input runs are
# longer than a test: make fuzz-agent, then the binary with -runs=1000000.
# timeout: 300
. "$(dirname "$0")/../lib.sh"
[ "$(id -u)" = 0 ] || skip "needs root (a network namespace of its own)"
fuzz agent_inputs_fuzz 30000 "agent_inputs_fuzz:"
