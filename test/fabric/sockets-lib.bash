# Shared by the socket tests and benchmarks: two namespace hosts with two
# rails each (tools/shunt-fabric --kind ns) and a PyTorch Gloo job on them.
# Source after test/lib.sh (needs $ROOT, $B, $LIB, $TMP, at_exit, fail).

FAB=$ROOT/tools/shunt-fabric
GLOO=$ROOT/examples/gloo_all_to_all.py

sock_need() {  # skip (77) unless root, MPTCP and the tools are here
  [ "$(id -u)" = 0 ] || skip "needs root for network namespaces"
  [ "$(cat /proc/sys/net/mptcp/enabled 2>/dev/null)" = 1 ] || skip "kernel without MPTCP"
  local t
  for t in "$@"; do command -v "$t" >/dev/null || skip "no $t (make deps)"; done
}

# Two hosts h1 h2, rails r0 r1: hI rR has 10.R.I.2. Removed at exit.
sock_fabric_up() {  # NAME [extra up options]
  SF=$1; shift
  "$FAB" --name "$SF" down >/dev/null 2>&1
  at_exit "'$FAB' --name '$SF' down >/dev/null 2>&1"
  "$FAB" --name "$SF" up --kind ns --hosts 2 --rails 2 --spines 1 "$@" >/dev/null || fail "fabric up"
}
sock_ns() { echo "sf-$SF-$1"; }
fab() { "$FAB" --name "$SF" "$@"; }

# The environment of a shunt process on host hI (I = 1 or 2).
sock_env() {  # I
  local i=$1
  mkdir -p "$TMP/run-h$i"
  echo LD_PRELOAD="$LIB" SHUNT_RUN_DIR="$TMP/run-h$i" SHUNT_LOG_LEVEL=info SHUNT_JOB_KEY="sockets-$SF" \
    SHUNT_PROBE_ADDRS="10.0.$i.2,10.1.$i.2" SHUNT_PROBE_NAME="h$i" \
    SHUNT_PEERS="h$((3 - i))=10.0.$((3 - i)).2,10.1.$((3 - i)).2"
}

# Runs the Gloo loop on both hosts for SECONDS with FAULT... started after
# WARMUP seconds; WITH is shunt, plain or mptcpize. Sets GLOO_RC (0 when
# both ranks passed) and GLOO_SUMMARY; logs in $TMP/gloo-LABEL-rank{0,1}.log.
gloo_run() {  # LABEL WITH SECONDS WARMUP FAULT...
  local label=$1 with=$2 secs=$3 warm=$4; shift 4
  local port=$((20000 + RANDOM % 20000)) pre0=(env) pre1=(env)
  case $with in
    shunt) pre0=(env $(sock_env 1)); pre1=(env $(sock_env 2)) ;;
    mptcpize) pre0=(mptcpize run); pre1=(mptcpize run) ;;
  esac
  local l0=$TMP/gloo-$label-rank0.log l1=$TMP/gloo-$label-rank1.log
  ip netns exec "$(sock_ns h1)" "${pre0[@]}" /usr/bin/python3 "$GLOO" 0 2 10.0.1.2 $port "$secs" r0 >"$l0" 2>&1 &
  local p0=$!
  ip netns exec "$(sock_ns h2)" "${pre1[@]}" /usr/bin/python3 "$GLOO" 1 2 10.0.1.2 $port "$secs" r0 >"$l1" 2>&1 &
  local p1=$!
  at_exit "kill $p0 $p1 2>/dev/null"
  sleep "$warm"
  "$@"
  local r0=0 r1=0
  wait $p0 || r0=$?
  wait $p1 || r1=$?
  GLOO_RC=$((r0 | r1))
  GLOO_SUMMARY=$(grep -hE "^rank 0: (OK|FAILED|WRONG)" "$l0" | cut -c1-150)
  [ -n "$GLOO_SUMMARY" ] || GLOO_SUMMARY="rank 0 exit $r0: $(tail -n 1 "$l0" | cut -c1-120)"
}

# Faults on rail 0 of h1 (the rail the job connects over).
fault_down_for() { fab fault port-down h1 r0 >/dev/null; sleep "$1"; fab fault port-up h1 r0 >/dev/null; }
fault_blackhole_for() { fab fault blackhole h1-r0 >/dev/null; sleep "$1"; fab fault unblackhole h1-r0 >/dev/null; }
fault_down_forever() { fab fault port-down h1 r0 >/dev/null; }
fault_flap() { fab fault flap --period 1000 --count "$1" h1-r0 >/dev/null; }
