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
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
