#!/usr/bin/env bash
# timeout: 600
# Verbs bundles on soft-RoCE guests, SHUNT_MODE=active on both ends:
# - ib_write_bw and shunt-bench all-to-all (-c 1, WRITE_WITH_IMM and SEND)
#   run unchanged and correct while their one-sided WRs ride shadow QPs of
#   their own UDP source ports, the peer's shim having set up the halves;
# - one application QP's traffic crosses both spines (flowlet spreading,
#   and split: each large WRITE_WITH_IMM cut over 8 paths at once, -c 1);
# - auto: bursts split and bursts kept on the application's QP, both tried
#   and the data right;
# - completions: the application's counts are exact (a shadow completion
#   reaches it as its own, a fence never);
# - ibv_rc_pingpong (SENDs only, poll and event mode) is untouched;
# - against a peer without shunt, or without the job key, the QP stays
#   primary-only and the program works.
# - ib_read_bw's READs ride shadows too; ib_send_bw and fi_pingpong
#   (libfabric's verbs provider, QPs connected through rdma_cm) work;
# - ib_write_bw -R (rdma_cm): its one-entry CQs are made deep enough for
#   the shadows that complete into them;
# - a 4-host all-to-all (-c 1) is correct with every QP bundled.
. "$(dirname "$0")/lib.sh"
need_guests
BENCH=$B/bin/shunt-bench
[ -f "$LIB" ] || fail "no $LIB (make)"
up --hosts 4 --rails 1 --spines 2
gid=$(fab gid h1 rxe0) || fail "no IPv4 GID"
dst=$(fab addr h2 r0)
BOOT=$(fab addr h1 r0)
KEY=bundle-test-key-$$
# run NAME HOST [VAR=VALUE...] CMD...: CMD under the preload in active mode
run() {
  local name=$1 host=$2; shift 2
  fab exec "$host" -- timeout 150 env LD_PRELOAD="$LIB" SHUNT_MODE=active SHUNT_SPREAD=flowlet SHUNT_JOB_KEY="$KEY" \
    SHUNT_PATHS_PER_RAIL=4 SHUNT_LOG_LEVEL=info SHUNT_STATS_FILE="/tmp/$name.json" "$@"
}
stats() { fab exec "$1" -- cat "/tmp/$2.json" > "$TMP/$2.json" || fail "no stats $2 on $1"; }
py() { python3 -c "import json,sys; d=json.load(open(sys.argv[1])); rc=[q for q in d['verbs']['qps'] if q['type'] == 'RC' and 'shadow_of' not in q]; $2" "$TMP/$1.json"; }

note "ib_write_bw, 1500 x 64 KiB"
run wbw-srv h2 ib_write_bw -d rxe0 -F -x "$gid" -n 1500 > "$TMP/srv.out" 2>&1 &
srv=$!
wait_port h2 18515 "$TMP/srv.out"
run wbw-cli h1 ib_write_bw -d rxe0 -F -x "$gid" -n 1500 "$dst" > "$TMP/cli.out" 2>&1 ||
  { cat "$TMP/cli.out"; fail "ib_write_bw failed under active shunt"; }
wait $srv || { rc=$?; cat "$TMP/srv.out"; fail "ib_write_bw server failed (exit $rc)"; }
grep -qE "^ 65536 +1500 " "$TMP/cli.out" || fail "no result line: $(cat "$TMP/cli.out")"
grep -q "bundle active with 4 shadow paths" "$TMP/cli.out" || { cat "$TMP/cli.out"; fail "no bundle on the client"; }
grep -q "bundle active with 4 shadow paths" "$TMP/srv.out" || { cat "$TMP/srv.out"; fail "no bundle on the server"; }
stats h1 wbw-cli
py wbw-cli 'b=rc[0]["bundle"]; print(b["state"], [p["wrs"] for p in b["paths"]], "fences", b["fences"])'
[ "$(py wbw-cli 'print(rc[0]["send_wrs"]["RDMA_WRITE"])')" = 1500 ] || fail "the application's WRITEs miscounted"
shadow=$(py wbw-cli 'print(sum(q["send_wrs"].get("RDMA_WRITE", 0) for q in d["verbs"]["qps"] if "shadow_of" in q))')
echo "WRITEs on shadow QPs: $shadow of 1500"
[ "$shadow" -gt 0 ] || fail "no WRITE went over a shadow path"
[ "$(py wbw-cli 'print(len([q for q in d["verbs"]["qps"] if q.get("shadow_of") == rc[0]["qpn"]]))')" = 4 ] ||
  fail "not 4 shadow QPs behind the application's QP"

# a2a_failed NAME N PID...: every rank's output and bundles, once the others
# ended too (their own stall timeout bounds that)
a2a_failed() {
  local name=$1 n=$2 r; shift 2
  wait "$@"
  for ((r = 0; r < n; r++)); do
    echo "=== rank $r"
    cat "$TMP/$name-$r.out"
    fab exec "h$((r + 1))" -- cat "/tmp/$name-$r.json" > "$TMP/$name-$r.json" 2>/dev/null &&
      py "$name-$r" '[print("QP", q["qpn"], b.get("state"), "held now", b.get("held_now"), "splits open",
          b.get("splits_open"), "messages sent", b.get("messages_sent"), "received", b.get("messages_received"),
          "primary in flight", b.get("primary", {}).get("in_flight"), "paths (wrs, in flight, down)",
          [(p["wrs"], p["in_flight"], p["down"]) for p in b.get("paths", [])]) for q in rc for b in [q.get("bundle", {})]]'
  done
}

# a2a NAME VERB PATHS [N]: shunt-bench alltoall over hosts h1..hN, -c 1
a2a() {
  local name=$1 verb=$2 paths=$3 n=${4:-2}
  note "shunt-bench alltoall $verb, -c 1, $paths paths, $n ranks"
  local port=$((29700 + RANDOM % 200)) r pids=()
  local args=(--world "$n" --bootstrap "$BOOT:$port" --transport verbs -d rxe0 --verb "$verb" -b 1M -e 1M
    --duration "${A2A_DUR:-8}" -w 1 -c 1 --seg 256K)
  for ((r = 1; r < n; r++)); do
    run "$name-$r" "h$((r + 1))" SHUNT_PATHS_PER_RAIL="$paths" ${A2A_ENV:-} "$BENCH" --rank $r "${args[@]}" \
      > "$TMP/$name-$r.out" 2>&1 &
    pids+=($!)
  done
  run "$name-0" h1 SHUNT_PATHS_PER_RAIL="$paths" ${A2A_ENV:-} "$BENCH" --rank 0 "${args[@]}" \
    > "$TMP/$name-0.out" 2>&1 || { a2a_failed "$name" "$n" "${pids[@]}"; fail "shunt-bench $verb failed"; }
  for ((r = 1; r < n; r++)); do
    wait "${pids[r - 1]}" || { cat "$TMP/$name-$r.out"; fail "shunt-bench rank $r failed"; }
  done
  grep -v '^#' "$TMP/$name-0.out" | awk '$1 ~ /^[0-9]+$/ && NF == 13 { n++; if ($9 != 0) bad = 1 } END { exit bad || !n }' ||
    { cat "$TMP/$name-0.out"; fail "$verb: #wrong not 0"; }
  stats h1 "$name-0"
  py "$name-0" 'b=rc[0]["bundle"]; print(b["state"], [p["wrs"] for p in b["paths"]], "fences", b["fences"], "held", b["held"])'
  local used
  used=$(py "$name-0" 'print(len([p for p in rc[0]["bundle"]["paths"] if p["wrs"] > 0]))')
  [ "$used" -ge 2 ] || fail "$verb: the QP used $used shadow paths, want several (flowlet)"
  [ "$(py "$name-0" 'print(len([q for q in rc if q.get("bundle", {}).get("state", "").startswith("active")]))')" = $((n - 1)) ] ||
    { py "$name-0" 'print("\n".join("QP %s: %s" % (q["qpn"], q.get("bundle", {}).get("state", "no bundle")) for q in rc))'
      grep -h "shunt" "$TMP/$name"-*.out | head -n 20
      fail "not every QP of rank 0 had an active bundle"; }
}
a2a imm write_imm 4
a2a send send 4
# Four guests on two host cores: an iteration takes over a second and a
# guest's CPU stalls for hundreds of ms, so probes at the default 250 ms
# would call live paths dead (issue 37's false failures, measured in
# docs/results.md); this part checks bundles, not detection. Its bundles
# also take longer to set up: the run is 16 s.
A2A_ENV="SHUNT_PATH_DEAD_MS=2000" A2A_DUR=16 a2a four write_imm 4 4

note "one application QP crosses both spines (8 paths, flowlet)"
for try in 1 2; do
  snap a
  a2a spread write_imm 8
  snap b
  s1=$(delta a b l1r0-s1 up_bytes); s2=$(delta a b l1r0-s2 up_bytes)
  echo "1 QP: s1 $s1 B, s2 $s2 B"
  # 8 source ports all hash to one spine 1 time in 128 (the hash seed is
  # random); a second run with fresh ports makes that 1 in 16384.
  [ $((s1 * 20)) -ge $((s1 + s2)) ] && [ $((s2 * 20)) -ge $((s1 + s2)) ] && break
  [ $try = 2 ] && fail "one QP's traffic stayed on one spine ($s1, $s2)"
done

note "SHUNT_SPREAD=split: each 256 KiB WRITE_WITH_IMM cut over 8 paths at once"
for try in 1 2; do
  snap a
  A2A_ENV="SHUNT_SPREAD=split SHUNT_SPLIT_MIN_BYTES=65536" a2a split write_imm 8
  snap b
  s1=$(delta a b l1r0-s1 up_bytes); s2=$(delta a b l1r0-s2 up_bytes)
  echo "1 QP, split: s1 $s1 B, s2 $s2 B"
  read -r splits segs msgs < <(py split-0 'b=rc[0]["bundle"]; print(b["splits"], b["segments"], b["messages_sent"])')
  echo "splits $splits, segments $segs, messages $msgs"
  # every message of rank 0 to rank 1 is one WRITE_WITH_IMM of 256 KiB
  [ "$splits" -gt 0 ] && [ "$splits" -ge $((msgs * 9 / 10)) ] || fail "split: $splits of $msgs messages were split"
  [ "$segs" -ge $((splits * 4)) ] || fail "split: $segs segments for $splits splits (8 paths)"
  [ $((s1 * 20)) -ge $((s1 + s2)) ] && [ $((s2 * 20)) -ge $((s1 + s2)) ] && break
  [ $try = 2 ] && fail "split: one QP's traffic stayed on one spine ($s1, $s2)"
done

note "SHUNT_SPREAD=auto: each burst split or kept on the application's QP, both tried"
A2A_ENV="SHUNT_SPREAD=auto SHUNT_SPLIT_MIN_BYTES=65536" a2a auto write_imm 8
read -r now sp pp splits prim < <(py auto-0 'b=rc[0]["bundle"]; a=b["auto"]; print(a["now"], a["split_periods"], a["pin_periods"], b["splits"], b["primary"]["wrs"])')
echo "auto: now $now, $sp split periods, $pp pinned, $splits splits, $prim WRs on the application's QP"
[ "$sp" -ge 3 ] && [ "$pp" -ge 3 ] && [ "$splits" -ge 3 ] || fail "auto: did not try both ways ($sp split, $pp pinned periods)"

pingpong() {
  local name=$1; shift
  pingpong_pair "$name" "$@"
  stats h1 "$name-cli"
  [ "$(py "$name-cli" 'print(rc[0]["recv_completions"])')" = 200 ] || fail "receives miscounted"
}
note "ibv_rc_pingpong, polling and events"
pingpong pp
pingpong ppe -e

# perftest NAME TOOL: 800 x 64 KiB h1 -> h2, both under active shunt
perftest() {
  local name=$1 tool=$2
  note "$tool, 800 x 64 KiB"
  run "$name-srv" h2 "$tool" -d rxe0 -F -x "$gid" -n 800 > "$TMP/srv.out" 2>&1 &
  local srv=$!
  wait_port h2 18515 "$TMP/srv.out"
  run "$name-cli" h1 "$tool" -d rxe0 -F -x "$gid" -n 800 "$dst" > "$TMP/cli.out" 2>&1 ||
    { cat "$TMP/cli.out"; fail "$tool failed under active shunt"; }
  wait $srv || { rc=$?; cat "$TMP/srv.out"; fail "$tool server failed (exit $rc)"; }
  grep -qE "^ 65536 +800 " "$TMP/cli.out" || fail "no result line: $(cat "$TMP/cli.out")"
  stats h1 "$name-cli"
  py "$name-cli" 'b=rc[0]["bundle"]; print(b["state"], [p["wrs"] for p in b["paths"]])'
}
perftest rbw ib_read_bw
reads=$(py rbw-cli 'print(sum(q["send_wrs"].get("RDMA_READ", 0) for q in d["verbs"]["qps"] if "shadow_of" in q))')
echo "READs on shadow QPs: $reads"
[ "$reads" -gt 0 ] || fail "no READ went over a shadow path"
perftest sbw ib_send_bw

note "fi_pingpong (libfabric verbs, rdma_cm) under active shunt"
run fi-srv h2 fi_pingpong -p verbs -e msg -I 200 -S 4096 > "$TMP/fi_srv" 2>&1 &
srv=$!
wait_port h2 47592 "$TMP/fi_srv"
run fi-cli h1 fi_pingpong -p verbs -e msg -I 200 -S 4096 "$dst" > "$TMP/fi" 2>&1 ||
  { cat "$TMP/fi" "$TMP/fi_srv"; fail "fi_pingpong client under active shunt"; }
wait $srv || { cat "$TMP/fi_srv"; fail "fi_pingpong server under active shunt"; }
grep -qE "^4k +200 " "$TMP/fi" || { cat "$TMP/fi"; fail "no fi_pingpong result line"; }

# perftest's rdma_cm mode (-R) creates CQs of one entry for its QP, which
# its 4 shadows complete into too: shunt makes them deep enough for all of
# them (rxe drops a completion that finds its CQ full, and a probe whose
# completion is lost leaves its path stalled for good).
note "ib_write_bw -R (rdma_cm): every CQ holds a completion of each QP on it"
run cm-srv h2 ib_write_bw -R -d rxe0 -F -D 8 > "$TMP/cm_srv" 2>&1 &
srv=$!
wait_port h2 18515 "$TMP/cm_srv"
run cm-cli h1 ib_write_bw -R -d rxe0 -F -D 8 "$dst" > "$TMP/cm" 2>&1 &
cli=$!
sleep 5
fab exec h1 -- rdma res show cq > "$TMP/cqs" 2>&1
wait $cli || { cat "$TMP/cm" "$TMP/cm_srv"; fail "ib_write_bw -R client under active shunt"; }
wait $srv || { cat "$TMP/cm_srv"; fail "ib_write_bw -R server under active shunt"; }
grep -q "comm ib_write_bw" "$TMP/cqs" || { cat "$TMP/cqs"; fail "no CQ of ib_write_bw seen"; }
awk '/comm ib_write_bw/ { for (i = 1; i < NF; i++) { if ($i == "cqe") c = $(i + 1); if ($i == "users") u = $(i + 1) }
  if (u > 1 && c + 0 < u + 0) bad = 1 } END { exit bad }' "$TMP/cqs" || { cat "$TMP/cqs"; fail "a CQ has fewer entries than QPs on it"; }
grep -E "users [2-9]" "$TMP/cqs" | grep -q "comm ib_write_bw" || { cat "$TMP/cqs"; fail "no CQ shared with shadows"; }

note "a peer without shunt: primary-only, and the program works"
# For 4 s, not a count of iterations: the program must outlast the
# bundle's 1.5 s of asking (on a fast host 600 WRITEs were over sooner,
# and its state was still "asking the peer").
gexec h2 ib_write_bw -d rxe0 -F -x "$gid" -D 4 > "$TMP/srv.out" 2>&1 &
srv=$!
wait_port h2 18515 "$TMP/srv.out"
run plain-cli h1 SHUNT_BUNDLE_SETUP_MS=1500 ib_write_bw -d rxe0 -F -x "$gid" -D 4 "$dst" > "$TMP/cli.out" 2>&1 ||
  { cat "$TMP/cli.out"; fail "ib_write_bw against a peer without shunt"; }
wait $srv || fail "plain server failed"
grep -qE "^ 65536 +[0-9]+ " "$TMP/cli.out" || fail "no result line: $(cat "$TMP/cli.out")"
stats h1 plain-cli
state=$(py plain-cli 'print(rc[0]["bundle"]["state"])')
echo "state: $state"
case $state in "primary-only: no shim answers at $dst"*) ;; *) fail "want primary-only (no shim), got: $state" ;; esac
grep -q "bundle stays primary-only" "$TMP/cli.out" || fail "no log line says why"

note "shadow creation refused: fewer paths, or none, and the program works"
# limit LIMIT_CLI LIMIT_SRV WANT: ib_write_bw with shadow creation failing
# once LIMIT shadows exist; WANT: the client's bundle paths (0: primary-only)
limit() {
  run "lim-srv" h2 SHUNT_TEST_SHADOW_LIMIT="$2" ib_write_bw -d rxe0 -F -x "$gid" -n 600 > "$TMP/srv.out" 2>&1 &
  local srv=$!
  wait_port h2 18515 "$TMP/srv.out"
  run "lim-cli" h1 SHUNT_TEST_SHADOW_LIMIT="$1" ib_write_bw -d rxe0 -F -x "$gid" -n 600 "$dst" > "$TMP/cli.out" 2>&1 ||
    { cat "$TMP/cli.out"; fail "ib_write_bw with shadow creation failing"; }
  wait $srv || { cat "$TMP/srv.out"; fail "server with shadow creation failing"; }
  grep -qE "^ 65536 +600 " "$TMP/cli.out" || fail "no result line: $(cat "$TMP/cli.out")"
  stats h1 lim-cli
  local got
  got=$(py lim-cli 'b=rc[0]["bundle"]; print(len(b["paths"]), b["state"])')
  echo "limits $1/$2: $got"
  case $3 in
    0) [[ $got == "0 primary-only: ibv_create_qp: injected failure"* ]] || fail "want primary-only, got: $got" ;;
    *) [[ $got == "$3 active"* ]] || fail "want $3 active paths, got: $got"
       [ "$(py lim-cli 'print(len([q for q in d["verbs"]["qps"] if "shadow_of" in q]))')" = "$3" ] ||
         fail "shadows left over beyond the $3 the peer made" ;;
  esac
}
limit 0 -1 0
limit -1 2 2

note "the peer's answer to the activation lost: both ends active all the same"
# h1 sets the bundle up (its GID is the lower). Left primary-only beside an
# active peer, it would refuse the peer's every move, and the peer would
# give its application errors at its carrier's first failure.
run lose-srv h2 ib_write_bw -d rxe0 -F -x "$gid" -n 600 > "$TMP/srv.out" 2>&1 &
srv=$!
wait_port h2 18515 "$TMP/srv.out"
run lose-cli h1 SHUNT_TEST_LOSE_ACTIVATION=1 ib_write_bw -d rxe0 -F -x "$gid" -n 600 "$dst" > "$TMP/cli.out" 2>&1 ||
  { cat "$TMP/cli.out"; fail "ib_write_bw with the activation's answer lost"; }
wait $srv || { cat "$TMP/srv.out"; fail "server with the activation's answer lost"; }
stats h1 lose-cli
stats h2 lose-srv
got="$(py lose-cli 'print(rc[0]["bundle"]["state"])') / $(py lose-srv 'print(rc[0]["bundle"]["state"])')"
echo "client / server: $got"
[[ $got == "active"*" / active"* ]] || fail "want both ends active, got: $got"
grep -q "answer to the activation was lost" "$TMP/cli.out" || fail "no log line says why"

note "no job key: no bundle at all (nothing to authenticate the peer with)"
nokey() {
  fab exec "$1" -- timeout 150 env LD_PRELOAD="$LIB" SHUNT_MODE=active SHUNT_SPREAD=flowlet SHUNT_LOG_LEVEL=info \
    SHUNT_STATS_FILE="/tmp/$2.json" ib_write_bw -d rxe0 -F -x "$gid" -n 500 "${@:3}"
}
nokey h2 nokey-srv > "$TMP/srv.out" 2>&1 &
srv=$!
wait_port h2 18515 "$TMP/srv.out"
nokey h1 nokey-cli "$dst" > "$TMP/cli.out" 2>&1 || { cat "$TMP/cli.out"; fail "ib_write_bw without a key"; }
wait $srv || fail "server without a key failed"
stats h1 nokey-cli
[ "$(py nokey-cli 'print("bundle" in rc[0], len(d["verbs"]["qps"]))')" = "False 1" ] ||
  fail "a bundle (or a shadow) without SHUNT_JOB_KEY"
grep -q "verbs bundles need SHUNT_JOB_KEY" "$TMP/cli.out" || fail "no log line says why"
echo ok
