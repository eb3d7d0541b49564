#!/usr/bin/env bash
# SHUNT_METRICS_ADDR takes what Prometheus exporters take: an IPv6 literal
# in brackets, a host name, or ":PORT" for every address (IPv4 clients
# included); a second agent that finds the port taken says so in a warning.
# timeout: 60
. "$(dirname "$0")/../lib.sh"
scrape() {  # URL
  python3 -c 'import sys, urllib.request; sys.stdout.write(urllib.request.urlopen(sys.argv[1], timeout=5).read().decode())' "$1"
}
serves() {  # NAME SHUNT_METRICS_ADDR URL...: an agent with that address answers at each URL
  local name=$1 addr=$2 url; shift 2
  mkdir -p "$TMP/run-$name"
  SHUNT_RUN_DIR=$TMP/run-$name SHUNT_METRICS_ADDR=$addr SHUNT_LOG_FILE=$TMP/$name.log LD_PRELOAD=$LIB \
    "$B/test/hold_socket" 20000 & local a=$!
  at_exit "kill $a 2>/dev/null"
  for url in "$@"; do
    for i in $(seq 50); do scrape "$url" > "$TMP/m" 2>/dev/null && break; sleep 0.1; done
    grep -q '^shunt_build_info{version="' "$TMP/m" || fail "SHUNT_METRICS_ADDR=$addr: no /metrics at $url: $(cat "$TMP/$name.log")"
    ok "SHUNT_METRICS_ADDR=$addr serves $url"
  done
  kill $a; wait $a 2>/dev/null
}
p=$(free_port)
serves all ":$p" "http://127.0.0.1:$p/metrics" "http://[::1]:$p/metrics"
p=$(free_port)
serves v6 "[::1]:$p" "http://[::1]:$p/metrics"
p=$(free_port)
serves name "localhost:$p" "http://127.0.0.1:$p/metrics"

# Two jobs' agents on one port: the second one warns.
p=$(free_port)
mkdir -p "$TMP/run-1" "$TMP/run-2"
SHUNT_RUN_DIR=$TMP/run-1 SHUNT_METRICS_ADDR=127.0.0.1:$p LD_PRELOAD=$LIB "$B/test/hold_socket" 20000 & a1=$!
at_exit "kill $a1 2>/dev/null"
for i in $(seq 50); do scrape "http://127.0.0.1:$p/metrics" > /dev/null 2>&1 && break; sleep 0.1; done
SHUNT_RUN_DIR=$TMP/run-2 SHUNT_METRICS_ADDR=127.0.0.1:$p SHUNT_LOG_FILE=$TMP/busy.log LD_PRELOAD=$LIB \
  "$B/test/hold_socket" 20000 & a2=$!
at_exit "kill $a2 2>/dev/null"
for i in $(seq 50); do grep -q "cannot listen" "$TMP/busy.log" 2>/dev/null && break; sleep 0.1; done
grep "cannot listen" "$TMP/busy.log" || fail "the second agent said nothing of the port: $(cat "$TMP/busy.log" 2>/dev/null)"
grep "cannot listen" "$TMP/busy.log" | grep -q "shunt warning: " || fail "a port taken is not a warning"
ok "a taken port is a warning"
