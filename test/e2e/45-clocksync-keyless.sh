#!/usr/bin/env bash
# Without SHUNT_JOB_KEY the host agent does not probe, and says why once: a
# probe key everyone can derive (the empty secret's, used before) let anyone
# forge probes. Two preloaded processes of one host with a rail named
# (SHUNT_PROBE_ADDRS): no probe socket is opened and the log has one line
# naming SHUNT_JOB_KEY. The same with a key: the engine binds its rail.
# timeout: 30
. "$(dirname "$0")/../lib.sh"
[ -f "$LIB" ] && [ -x "$B/test/hold_socket" ] || skip "build $LIB and $B/test/hold_socket first"
command -v ss >/dev/null || skip "no ss"
port=$(python3 -c 'import socket; s=socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
run_host() {  # NAME [VAR=VALUE...]: two processes, one of them the agent
  local name=$1; shift
  mkdir -p "$TMP/run-$name"
  local e=(env SHUNT_RUN_DIR="$TMP/run-$name" SHUNT_MODE=observe SHUNT_LOG_LEVEL=info SHUNT_LOG_FILE="$TMP/$name.log"
           SHUNT_PROBE_ADDRS=127.0.0.1 SHUNT_PROBE_PORT="$port" SHUNT_PEERS=p=127.0.0.2 SHUNT_CLOCK_SHM= "$@"
           LD_PRELOAD="$LIB" "$B/test/hold_socket" 2500)
  "${e[@]}" & local a=$!
  sleep 0.3
  "${e[@]}" & local b=$!
  at_exit "kill $a $b 2>/dev/null"
  sleep 1.5
  ss -Huln "sport = :$port" > "$TMP/$name.ss"
  wait $a $b
}
run_host keyless SHUNT_JOB_KEY=
[ -s "$TMP/keyless.ss" ] && { cat "$TMP/keyless.ss"; fail "a probe socket was opened without a key"; }
n=$(grep -c "no probing" "$TMP/keyless.log")
[ "$n" = 1 ] || { cat "$TMP/keyless.log"; fail "$n log lines say that nothing is probed, want 1"; }
grep "no probing" "$TMP/keyless.log" | grep -q "set SHUNT_JOB_KEY" || fail "the line does not say what to set"
grep "no probing" "$TMP/keyless.log" | grep -q "shunt warning: " || fail "the line is not a warning (a setting to make, not a fault)"
grep -q "clocksync: rail" "$TMP/keyless.log" && fail "the engine opened a rail without a key"
ok "no key: no probing, one line: $(grep "no probing" "$TMP/keyless.log")"
run_host keyed SHUNT_JOB_KEY=keyless-e2e-$$
[ -s "$TMP/keyed.ss" ] || { cat "$TMP/keyed.log"; fail "with a key the engine did not bind its rail"; }
grep -q "clocksync: rail 0 127.0.0.1:$port" "$TMP/keyed.log" || fail "with a key no rail was logged"
grep -q "no probing" "$TMP/keyed.log" && fail "with a key the log still says nothing is probed"
ok "with a key the engine probes"
