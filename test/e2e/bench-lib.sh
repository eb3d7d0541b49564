# Sourced by the shunt-bench tests: start N ranks on loopback (or inside a
# namespace), wait for them with a bound, and check the output.
ROOT=${SHUNT_ROOT:-$(cd "$(dirname "$0")/../.." && pwd)}
BENCH=$ROOT/${BUILD:-build}/bin/shunt-bench
[ -x "$BENCH" ] || { echo "shunt-bench not built ($BENCH)"; exit 77; }
WORK=$(mktemp -d /tmp/shunt-bench-test.XXXXXX)
PIDS=()
bench_cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; done
  for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null; done
  rm -rf "$WORK"
}
trap bench_cleanup EXIT

fail() { echo "FAIL: $*"; exit 1; }

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

# run_ranks N OUT ARGS...: ranks 1..N-1 in the background (logs in
# $WORK/rankR.log), rank 0 in the foreground with stdout to OUT; returns
# rank 0's exit status, and fails if any other rank failed differently.
# $NETNS_OF (a function) may name a namespace per rank.
run_ranks() {
  local n=$1 out=$2; shift 2
  local port; port=$(free_port)
  local boot=${BOOT_HOST:-127.0.0.1}:$port
  local r pids=()
  for ((r = 1; r < n; r++)); do
    $(ns_prefix $r) timeout 60 "$BENCH" --rank $r --world $n --bootstrap "$boot" "$@" \
      >"$WORK/rank$r.log" 2>&1 &
    pids+=($!); PIDS+=($!)
  done
  $(ns_prefix 0) timeout 60 "$BENCH" --rank 0 --world $n --bootstrap "$boot" "$@" >"$out" 2>"$WORK/rank0.err"
  local rc0=$? rc
  RANK_RCS=()
  for p in "${pids[@]}"; do wait "$p"; rc=$?; RANK_RCS+=($rc); done
  return $rc0
}

ns_prefix() {
  if declare -F netns_of >/dev/null; then
    local ns; ns=$(netns_of "$1")
    [ -n "$ns" ] && echo "ip netns exec $ns"
  fi
}

# The table rows (lines not starting with #).
rows() { grep -v '^#' "$1" | grep -v '^[[:space:]]*$'; }

# Every row has 13 columns (out-of-place and in-place groups) and the
# out-of-place #wrong equal to $2.
expect_wrong() {
  local f=$1 want=$2
  local n; n=$(rows "$f" | wc -l)
  [ "$n" -gt 0 ] || fail "no result rows in $f"
  rows "$f" | awk -v w="$want" 'NF != 13 || $9 != w { print "bad row: " $0; bad = 1 } END { exit bad }' ||
    fail "rows of $f do not all have #wrong $want"
}

# veth_pair TAG SUBNET: two namespaces $A and $B joined by a veth (v0 in $A
# at SUBNET.1, v1 in $B at SUBNET.2), removed on exit; skips without root.
veth_pair() {
  [ "$(id -u)" = 0 ] || { echo "needs root for network namespaces"; exit 77; }
  A=$1-$$-a B=$1-$$-b
  ns_cleanup() { ip netns del $A 2>/dev/null; ip netns del $B 2>/dev/null; bench_cleanup; }
  trap ns_cleanup EXIT
  ip netns add $A && ip netns add $B || { echo "cannot create namespaces"; exit 77; }
  ip -n $A link add v0 type veth peer name v1 netns $B || fail "veth"
  ip -n $A addr add "$2.1/24" dev v0 && ip -n $B addr add "$2.2/24" dev v1
  for ns in $A $B; do ip -n $ns link set lo up; done
  ip -n $A link set v0 up && ip -n $B link set v1 up
}
