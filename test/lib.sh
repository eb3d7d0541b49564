# Shared by the test scripts: paths, failure reporting, JSON queries.
# Source it: . "$(dirname "$0")/../lib.sh"
set -u
ROOT=${SRC_ROOT:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)}
B=${BUILD:-build}
case $B in /*) ;; *) B=$ROOT/$B ;; esac
LIB=$B/lib/libshunt.so
TMP=$(mktemp -d /tmp/shunt-test.XXXXXX)
cleanup_hooks=()
on_exit() { for h in "${cleanup_hooks[@]}"; do eval "$h"; done; rm -rf "$TMP"; }
trap on_exit EXIT
at_exit() { cleanup_hooks+=("$1"); }

fail() { echo "FAIL: $*" >&2; exit 1; }
skip() { echo "$*"; exit 77; }
ok() { echo "ok: $*"; }

# jq-like query with python: jget FILE 'expr over d' (d is the parsed JSON)
jget() { python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print($2)" "$1"; }

expect_eq() {  # expect_eq ACTUAL EXPECTED WHAT
  [ "$1" = "$2" ] || fail "$3: got '$1', expected '$2'"
  ok "$3 = $2"
}

# A free TCP port on loopback.
# veth_pair NA NB: two network namespaces joined by a veth pair, NA at
# 10.99.0.1/24 (va), NB at 10.99.0.2/24 (vb), removed at exit; skips where
# namespaces cannot be made.
veth_pair() {
  ip netns add "$1" 2>/dev/null || skip "cannot create network namespaces here"
  at_exit "ip netns del $1 2>/dev/null; ip netns del $2 2>/dev/null"
  ip netns add "$2"
  ip link add va netns "$1" type veth peer name vb netns "$2"
  ip -n "$1" addr add 10.99.0.1/24 dev va
  ip -n "$2" addr add 10.99.0.2/24 dev vb
  for n in "$1" "$2"; do ip -n "$n" link set lo up; done
  ip -n "$1" link set va up
  ip -n "$2" link set vb up
}
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# fuzz TARGET RUNS [MARK]: builds build/fuzz/TARGET, runs it for RUNS inputs
# from its seed corpus in test/fuzz/corpus/TARGET (libFuzzer), and fails on
# a finding (its first ERROR, SUMMARY or MARK line) or too few inputs.
fuzz() {
  local target=$1 runs=$2 mark="${3:+$3|}ERROR|SUMMARY" rc done
  command -v clang++ >/dev/null || fail "clang++ missing (make deps installs it)"
  make -s -C "$ROOT" "${BUILD:-build}/fuzz/$target" || fail "fuzz target did not build"
  mkdir -p "$TMP/corpus"
  "$B/fuzz/$target" -runs="$runs" -max_len=2048 "$TMP/corpus" "$ROOT/test/fuzz/corpus/$target" > "$TMP/log" 2>&1
  rc=$?
  tail -n 3 "$TMP/log"
  [ $rc = 0 ] || fail "fuzzer found a problem: $(grep -m1 -E "$mark" "$TMP/log")"
  done=$(grep -o 'Done [0-9]* runs' "$TMP/log" | grep -o '[0-9]*')
  ok "${done:-?} inputs"
  [ "${done:-0}" -ge "$runs" ] || fail "only ${done:-0} inputs"
}
