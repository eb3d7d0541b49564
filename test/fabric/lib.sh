# Sourced by test/fabric/*.sh: brings up one fabric per test file, tears it
# down on exit, and offers small helpers around shunt-fabric.
set -u
ROOT=${SHUNT_ROOT:-$(cd "$(dirname "$0")/../.." && pwd)}
FABRIC=$ROOT/tools/shunt-fabric
B=${BUILD:-build}
case $B in /*) ;; *) B=$ROOT/$B ;; esac
LIB=$B/lib/libshunt.so
NAME=t$$
TMP=$(mktemp -d)

skip() { echo "$*"; exit 77; }
fail() { echo "FAIL: $*"; exit 1; }
note() { echo "--- [${SECONDS}s] $*"; }
jget() { python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print($2)" "$1"; }
fab() { "$FABRIC" --name "$NAME" "$@"; }

cleanup() {
  rc=$?
  # A failed test shows what its guests' kernels said (the console holds
  # errors and worse: a soft lockup, a hung task, an rxe warning), before
  # the fabric and its state go. The warning ib_core prints at every port
  # query of a virtio NIC ("speed is unknown") is left out.
  if [ "$rc" != 0 ] && [ "$rc" != 77 ]; then
    local c
    for c in "${SHUNT_FABRIC_STATE:-/run/shunt-fabric}/$NAME"/*.console; do
      [ -s "$c" ] || continue
      echo "--- ${c##*/}, its last lines:"
      grep -a -v -e '^\s*$' -e 'speed is unknown, defaulting' "$c" | tail -n 15 | sed 's/^/  /'
    done
  fi
  "$FABRIC" --name "$NAME" down >/dev/null 2>&1
  # SHUNT_TEST_KEEP=DIR keeps a failed test's files there for reading.
  [ "$rc" != 0 ] && [ -n "${SHUNT_TEST_KEEP:-}" ] && cp -r "$TMP" "$SHUNT_TEST_KEEP" 2>/dev/null
  rm -rf "$TMP"
  exit $rc
}

need_root() {
  [ "$(id -u)" = 0 ] || skip "needs root (network namespaces)"
  ip netns add "sf-probe-$$" 2>/dev/null || skip "cannot create network namespaces"
  ip netns del "sf-probe-$$"
}

need_guests() {
  need_root
  command -v qemu-system-x86_64 >/dev/null || skip "no qemu-system-x86_64 (make deps)"
  [ -c /dev/net/tun ] || skip "no /dev/net/tun"
  for c in ib_write_bw ibv_rc_pingpong fi_pingpong rdma; do
    command -v $c >/dev/null || skip "no $c (make deps)"
  done
  "$ROOT/tools/guest/build-guest" "${BUILD:-$ROOT/build}/guest" >/dev/null 2>&1 ||
    skip "cannot build the guest kernel (make deps)"
  export SHUNT_FABRIC_GUEST=${BUILD:-$ROOT/build}/guest
  case $SHUNT_FABRIC_GUEST in /*) ;; *) SHUNT_FABRIC_GUEST=$ROOT/$SHUNT_FABRIC_GUEST ;; esac
}

up() {
  trap cleanup EXIT
  trap 'exit 130' INT TERM
  local t0=$SECONDS
  fab up "$@" || fail "shunt-fabric up $*"
  note "up in $((SECONDS - t0))s"
}

snap() { fab counters --json > "$TMP/$1"; }

# delta SNAP_A SNAP_B LINK FIELD -> counter difference
delta() {
  python3 - "$TMP/$1" "$TMP/$2" "$3" "$4" <<'EOF'
import json, sys
a, b = (json.load(open(p))["links"][sys.argv[3]] for p in sys.argv[1:3])
if a is None or b is None:
    sys.exit("delta: no counters of link %s in %s" % (sys.argv[3], sys.argv[1 if a is None else 2]))
print(b[sys.argv[4]] - a[sys.argv[4]])
EOF
}

# gexec HOST CMD...: a command on a guest, bounded in time
gexec() { local h=$1; shift; fab exec "$h" -- timeout 120 "$@"; }

# wait_port HOST PORT [LOG] [SECONDS]: until something listens there (TCP
# or rdma_cm), at most SECONDS (30). A failure shows what runs and listens
# on HOST (shunt-fabric wait-port) and the server's output so far (LOG,
# the file the caller sends it to).
wait_port() {
  fab wait-port --timeout "${4:-30}" "$1" "$2" 2>&1 && return 0
  if [ -n "${3:-}" ]; then
    echo "--- the server's output (${3##*/}):"
    tail -n 30 "$3"
  fi
  fail "nothing listens on $1:$2"
}

# wait_bundles HOST N [SECONDS]: until the metrics of HOST's host agent show
# N bundles up (or degraded), at most SECONDS (30); 1 when they do not. A
# fault meant for an active bundle waits for it: before, the application's
# QP alone carries the work and its error is the application's.
wait_bundles() {
  local t=$((SECONDS + ${3:-30})) n
  while [ $SECONDS -lt $t ]; do
    n=$(fab exec "$1" -- curl -sS -m 5 http://127.0.0.1:9471/metrics 2>/dev/null |
      awk '/^shunt_bundles\{.*state="(up|degraded)"/ { n += $NF } END { print n + 0 }')
    [ "${n:-0}" -ge "$2" ] && return 0
    sleep 0.5
  done
  echo "wait_bundles: $1 has ${n:-0} bundles up after ${3:-30} s, not $2"
  return 1
}

# bw_avg FILE: BW average (MB/s) from ib_write_bw output
bw_avg() { awk '$1 ~ /^[0-9]+$/ && NF >= 5 { v = $4 } END { print v + 0 }' "$1"; }

# pingpong_pair NAME ARGS...: ibv_rc_pingpong, 200 round trips of 4096
# bytes, h2 serving and h1 connecting to $dst with GID index $gid, each
# started through the calling test's own run(); fails unless both finished
# and the client reports every byte.
pingpong_pair() {
  local name=$1; shift
  run "$name-srv" h2 ibv_rc_pingpong -d rxe0 -g "$gid" -n 200 "$@" > "$TMP/srv.out" 2>&1 &
  local srv=$!
  wait_port h2 18515 "$TMP/srv.out"
  run "$name-cli" h1 ibv_rc_pingpong -d rxe0 -g "$gid" -n 200 "$@" "$dst" > "$TMP/cli.out" 2>&1 ||
    { cat "$TMP/cli.out"; fail "ibv_rc_pingpong $* failed"; }
  wait $srv || { cat "$TMP/srv.out"; fail "ibv_rc_pingpong server failed"; }
  grep -q "1638400 bytes in" "$TMP/cli.out" || fail "unexpected output: $(cat "$TMP/cli.out")"
}

# learn_sports TABLE LEAF ADDR: on router namespace LEAF, an nft table that
# learns the UDP source ports of RoCE packets from ADDR (set `seen`) and a
# chain `cut` for drop rules. seen_sports TABLE LEAF lists the ports learnt.
# Datagrams that expire at the next router (TTL <= 2 here: path discovery's)
# are no flow and are not learnt.
learn_sports() {
  ip netns exec "$2" nft -f - <<EOF
table ip $1 {
  set seen { type inet_service; flags dynamic; }
  chain learn { type filter hook forward priority -20; ip saddr $3 udp dport 4791 ip ttl > 2 add @seen { udp sport }; }
  chain cut { type filter hook forward priority -30; }
}
EOF
}
seen_sports() {
  ip netns exec "$2" nft -j list set ip "$1" seen | python3 -c '
import json, sys
for x in json.load(sys.stdin)["nftables"]:
    for e in x.get("set", {}).get("elem", []):
        print(e if isinstance(e, int) else e.get("elem", {}).get("val", e))'
}

# sport_watch: on both spines, an nft table that records the (source
# address, UDP source port) of the RoCEv2 packets (set roce) and the probes
# (set probe) each forwards, to tell which spine a port's traffic took.
sport_watch() {
  local s
  for s in s1 s2; do
    ip netns exec "sf-$NAME-$s" nft -f - <<'EOF' || fail "nft on $s"
table ip sportseen {
  set roce { type ipv4_addr . inet_service; flags dynamic; }
  set probe { type ipv4_addr . inet_service; flags dynamic; }
  chain forward {
    type filter hook forward priority 0;
    udp dport 4791 add @roce { ip saddr . udp sport }
    udp dport 7471 add @probe { ip saddr . udp sport }
  }
}
EOF
  done
}

# sport_seen SPINE SET -> the ADDR:PORT pairs sport_watch saw there
# probe_agent HOST OWN PEER: the host's agent first (the first preloaded
# process to open a socket; this one only sleeps), probing PEER from OWN
# every 50 ms under $KEY, so its probe engine knows the peer's clear base
# delay before a job loads the fabric. Log: $TMP/agent-HOST.log.
probe_agent() {
  fab exec "$1" -- env LD_PRELOAD="$LIB" SHUNT_JOB_KEY="$KEY" SHUNT_PROBE_ADDRS="$2" SHUNT_PROBE_NAME="$2" \
    SHUNT_PEERS="$3=$3" SHUNT_PROBE_INTERVAL_MS=50 SHUNT_PATH_DEAD_MS=8000 \
    python3 -c "import socket, time; s = socket.socket(); time.sleep(200)" > "$TMP/agent-$1.log" 2>&1 &
}

# slow_link LINK [DIVISOR] [QUEUE_MS]: limits LINK (both ways) to a
# DIVISOR'th (3 unless given) of the rate it carried over 3 s (at least 0.3
# Mbit/s; QUEUE_MS of tbf queue, 1000 unless given): the rate follows the
# host's speed (soft-RoCE on emulated CPUs), so a fixed limit may not bind.
# Sets sent (bytes in that window), t0 and t1 (its ends) and limit (Mbit/s).
# Sets fault_ns to h1's monotonic clock read just before the limit goes on
# (read after it, a move that came within the read's round trip to the
# guest, about half a second, was dated before the fault).
slow_link() {
  t0=$(date +%s.%N); snap c0; sleep 3; snap c1; t1=$(date +%s.%N)
  sent=$(delta c0 c1 "$1" up_bytes) || fail "counters of $1"
  limit=$(python3 -c "import sys; print(round(max(0.3, int(sys.argv[1]) * 8 / (float(sys.argv[3]) - float(sys.argv[2])) / 1e6 / int(sys.argv[4])), 2))" "$sent" "$t0" "$t1" "${2:-3}")
  fault_ns=$(fab exec h1 -- python3 -c 'import time; print(time.monotonic_ns())')
  fab fault rate "$1" "$limit" --queue-ms "${3:-1000}" >/dev/null || fail "rate $1"
}

sport_seen() {
  ip netns exec "sf-$NAME-$1" nft -j list set ip sportseen "$2" | python3 -c '
import json, sys
for x in json.load(sys.stdin)["nftables"]:
    for e in x.get("set", {}).get("elem", []):
        a, p = e["concat"]
        print("%s:%s" % (a, p), end=" ")'
}
