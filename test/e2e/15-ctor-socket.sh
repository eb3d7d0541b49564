#!/usr/bin/env bash
# socket() called from another library's constructor, before libshunt's
# constructor has run, works and is seen.
# timeout: 30
. "$(dirname "$0")/../lib.sh"
out=$(SHUNT_MODE=observe SHUNT_STATS_FILE="$TMP/st.json" LD_PRELOAD=$LIB "$B/test/ctor_socket") || fail "program failed: $out"
echo "$out"
expect_eq "$(jget "$TMP/st.json" 'len(d["sockets"])')" 1 "socket from the constructor tracked"
expect_eq "$(jget "$TMP/st.json" 'd["sockets"][0]["open"]')" False "and its close seen"
