#!/usr/bin/env bash
# libshunt registers no destructor of its own state to run at exit, except
# the runner of its exit hooks: its threads (the agent, the failover and
# metrics threads) may still be at work while the application's exit() runs
# the static destructors, and a map destroyed under them crashes the
# application. Every registration (__cxa_atexit from libshunt.so) is caught
# by a preloaded spy, under a plain program and under an active process
# that becomes the host's agent, and named from the library's symbols.
# timeout: 60
. "$(dirname "$0")/../lib.sh"
SPY=$B/test/atexit_spy_lib.so
[ -f "$SPY" ] || fail "no $SPY (make $SPY)"
command -v addr2line >/dev/null || fail "addr2line missing (binutils)"
export SHUNT_RUN_DIR=$TMP/run SHUNT_MODE=active SHUNT_JOB_KEY=exit-destructors SHUNT_REPORT_INTERVAL_MS=200
mkdir -p "$SHUNT_RUN_DIR"
LD_PRELOAD="$SPY:$LIB" /bin/true 2> "$TMP/true.err" || fail "/bin/true failed under libshunt"
timeout 20 env LD_PRELOAD="$SPY:$LIB" "$B/test/hold_socket" 5000 2> "$TMP/hold.err" & p=$!
at_exit "kill $p 2>/dev/null"
for _ in $(seq 50); do [ -S "$SHUNT_RUN_DIR/agent.sock" ] && break; sleep 0.1; done
[ -S "$SHUNT_RUN_DIR/agent.sock" ] || fail "the process never became the agent"
"$B/bin/shuntctl" status --json > /dev/null || fail "no agent answers"
wait "$p" || fail "the agent process exited $?"
n=0 bad=()
while read -r tag fn obj; do
  [ "$tag" = atexit ] || continue
  n=$((n + 1))
  name=$(addr2line -f -C -e "$LIB" "0x$fn" | head -n 1)
  what=$(nm -C "$LIB" | awk -v a="$(printf '%016x' "0x$obj")" '$1 == a { $1 = $2 = ""; print; exit }')
  echo "registered: $name (object:${what:- ?})"
  [[ $name == *run_exit_hooks* ]] || bad+=("$(echo ${what:-$name})")
done < <(cat "$TMP/true.err" "$TMP/hold.err")
[ $n -ge 2 ] || fail "the spy saw $n registrations (expected the exit hooks' runner in each of 2 processes)"
grep -q '^atexit ' "$TMP/hold.err" || fail "the spy saw nothing registered in the agent's process"
[ ${#bad[@]} = 0 ] ||
  fail "destroyed at exit, under shunt's threads: $(printf '%s\n' "${bad[@]}" | sort -u | paste -sd';' | sed 's/;/; /g')"
ok "$n registrations, each the exit hooks' runner"
