#!/usr/bin/env bash
# shuntctl members and sockets print tables unless --json is given (they
# once printed the agent's JSON either way); --json still gives the JSON.
# timeout: 60
. "$(dirname "$0")/../lib.sh"
export SHUNT_RUN_DIR=$TMP/run SHUNT_MODE=observe SHUNT_REPORT_INTERVAL_MS=200 SHUNT_METRICS_ADDR=off
mkdir -p "$SHUNT_RUN_DIR"
ctl() { "$B/bin/shuntctl" "$@"; }
LD_PRELOAD=$LIB "$B/test/hold_socket" 40000 & a=$!
at_exit "kill $a 2>/dev/null"
for i in $(seq 1 50); do ctl members --json >"$TMP/m.json" 2>/dev/null && grep -q "\"$a\"" "$TMP/m.json" && break; sleep 0.1; done
jget "$TMP/m.json" 'd["members"]["'$a'"]["mode"]' | grep -qx observe || { cat "$TMP/m.json"; fail "members --json"; }

ctl members >"$TMP/m.txt" || fail "shuntctl members exited $?"
cat "$TMP/m.txt"
python3 -c 'import json, sys; json.load(open(sys.argv[1]))' "$TMP/m.txt" 2>/dev/null && fail "members printed JSON without --json"
grep -Eq '^pid +mode +rank +qps +sockets' "$TMP/m.txt" || fail "members: no table header"
grep -Eq "^$a +observe " "$TMP/m.txt" || fail "members: no row for $a"

ctl sockets --json >"$TMP/s.json" || fail "shuntctl sockets --json exited $?"
jget "$TMP/s.json" 'd["sockets_mode"]' >/dev/null || { cat "$TMP/s.json"; fail "sockets --json"; }
ctl sockets >"$TMP/s.txt" || fail "shuntctl sockets exited $?"
cat "$TMP/s.txt"
python3 -c 'import json, sys; json.load(open(sys.argv[1]))' "$TMP/s.txt" 2>/dev/null && fail "sockets printed JSON without --json"
grep -Eq "^sockets mode $(jget "$TMP/s.json" 'd["sockets_mode"]'), status " "$TMP/s.txt" || fail "sockets: no summary line"
ok "members and sockets print tables"

# diagnose --watch: a line a second, and with --plot a drawing, here with
# nothing to draw (no verbs traffic, no probe peers): it says so.
ctl diagnose --local --watch 2 --plot "$TMP/w.svg" >"$TMP/w.txt" || { cat "$TMP/w.txt"; fail "diagnose --watch exited $?"; }
cat "$TMP/w.txt"
[ "$(grep -Ec '^ +[0-9.]+ s  (healthy|SLOW)' "$TMP/w.txt")" = 2 ] || fail "diagnose --watch 2: not two lines"
grep -qx "plot: $TMP/w.svg" "$TMP/w.txt" || fail "diagnose --watch: no plot line"
grep -q "no step rhythm seen" "$TMP/w.svg" || fail "the plot does not say it saw no step"
ctl diagnose --plot "$TMP/x.svg" 2>/dev/null && fail "--plot without --watch was taken"
ok "diagnose --watch draws"
