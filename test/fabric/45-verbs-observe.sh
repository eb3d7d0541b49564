#!/usr/bin/env bash
# timeout: 400
# Real verbs programs on soft-RoCE guests, unmodified, under the preload in
# observe mode: they run as without it, and shunt's counters match the
# traffic they report exactly (ibv_rc_pingpong in poll and event mode,
# ib_write_bw, ib_send_bw, shunt-bench verbs all-to-all with -c 1).
. "$(dirname "$0")/lib.sh"
need_guests
[ -f "$LIB" ] || fail "no $LIB (make)"
up --hosts 2 --rails 2 --spines 2
gid=$(fab gid h1 rxe0) || fail "no IPv4 GID"
dst=$(fab addr h2 r0)
# run NAME HOST CMD...: CMD on HOST under the preload (only CMD: a preloaded
# `timeout` would write its own, empty, stats file under the same name).
run() {
  local name=$1 host=$2; shift 2
  fab exec "$host" -- timeout 120 env LD_PRELOAD="$LIB" SHUNT_MODE=observe SHUNT_STATS_FILE="/tmp/$name.json" "$@"
}
stats() { fab exec "$1" -- cat "/tmp/$2.json" > "$TMP/$2.json" || fail "no stats $2 on $1"; }
jq_() { python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print($2)" "$TMP/$1.json"; }
expect() { [ "$1" = "$2" ] || fail "$3: got $1, expected $2"; echo "ok: $3 = $2"; }

# pingpong NAME EXTRA-ARGS: 200 round trips of 4096 bytes h1 <-> h2 on rail 0
pingpong() {
  local name=$1; shift
  pingpong_pair "$name" "$@"
  stats h1 "$name-cli"
  stats h2 "$name-srv"
  for side in cli srv; do
    f=$name-$side
    expect "$(jq_ "$f" 'len([q for q in d["verbs"]["qps"] if q["type"] == "RC"])')" 1 "$f: RC QPs"
    expect "$(jq_ "$f" '[q for q in d["verbs"]["qps"] if q["type"] == "RC"][0]["send_wrs"].get("SEND", 0)')" 200 "$f: SEND WRs"
    expect "$(jq_ "$f" '[q for q in d["verbs"]["qps"] if q["type"] == "RC"][0]["send_bytes"]')" 819200 "$f: bytes sent"
    expect "$(jq_ "$f" '[q for q in d["verbs"]["qps"] if q["type"] == "RC"][0]["recv_completions"]')" 200 "$f: receives completed"
    expect "$(jq_ "$f" '[q for q in d["verbs"]["qps"] if q["type"] == "RC"][0]["recv_bytes"]')" 819200 "$f: bytes received"
    expect "$(jq_ "$f" '[q for q in d["verbs"]["qps"] if q["type"] == "RC"][0]["errors"]')" "{}" "$f: error completions"
    expect "$(jq_ "$f" 'd["verbs"]["calls"]["ibv_open_device"]')" 1 "$f: devices opened through shunt"
  done
}

note "ibv_rc_pingpong, polling"
pingpong poll
note "ibv_rc_pingpong -e, completion events"
pingpong event -e
n=$(jq_ event-cli 'd["verbs"]["devices"][0]["notify_calls"]')
[ "$n" -ge 1 ] || fail "event mode made no ibv_req_notify_cq through shunt"
echo "ok: ibv_req_notify_cq calls seen: $n"

# perftest NAME TOOL OPCODE: 1000 x 64 KiB h1 -> h2 with a perftest tool
# under the preload on both ends; the client's WRs of OPCODE and their bytes
# must be counted exactly, and so must the bytes the server receives.
perftest() {
  local name=$1 tool=$2 op=$3
  note "$tool, 1000 x 64 KiB"
  run "$name-srv" h2 "$tool" -d rxe0 -F -x "$gid" -n 1000 > "$TMP/srv.out" 2>&1 &
  local srv=$!
  wait_port h2 18515 "$TMP/srv.out"
  run "$name-cli" h1 "$tool" -d rxe0 -F -x "$gid" -n 1000 "$dst" > "$TMP/cli.out" 2>&1 ||
    fail "$tool failed under the preload: $(cat "$TMP/cli.out")"
  wait $srv || fail "$tool server failed: $(cat "$TMP/srv.out")"
  grep -qE "^ 65536 +1000 " "$TMP/cli.out" || fail "no result line: $(cat "$TMP/cli.out")"
  stats h1 "$name-cli"
  expect "$(jq_ "$name-cli" "sum(q['send_wrs'].get('$op', 0) for q in d['verbs']['qps'])")" 1000 "$op WRs counted"
  expect "$(jq_ "$name-cli" "sum(q['send_bytes'] for q in d['verbs']['qps'] if q['send_wrs'].get('$op'))")" 65536000 "bytes of the $op WRs"
}
perftest wbw ib_write_bw RDMA_WRITE
perftest sbw ib_send_bw SEND
stats h2 sbw-srv
expect "$(jq_ sbw-srv 'sum(q["recv_bytes"] for q in d["verbs"]["qps"])')" 65536000 "bytes received by the ib_send_bw server"

note "shunt-bench verbs all-to-all, -c 1, under the preload"
port=29500
h1a=$(fab addr h1 r1)
run sb1 h2 "$B/bin/shunt-bench" -p alltoall --transport verbs -d rxe0 \
  --rank 1 --world 2 --bootstrap "$h1a:$port" -b 64K -e 256K -f 2 -n 20 -w 2 -c 1 > "$TMP/sb1.out" 2>&1 &
r1=$!
run sb0 h1 "$B/bin/shunt-bench" -p alltoall --transport verbs -d rxe0 \
  --rank 0 --world 2 --bootstrap "$h1a:$port" -b 64K -e 256K -f 2 -n 20 -w 2 -c 1 > "$TMP/sb0.out" 2>&1 ||
  fail "shunt-bench under the preload failed: $(cat "$TMP/sb0.out")"
wait $r1 || fail "rank 1 failed: $(cat "$TMP/sb1.out")"
cat "$TMP/sb0.out"
grep -v '^#' "$TMP/sb0.out" | awk '$1 ~ /^[0-9]+$/ && NF == 13 { rows++; if ($9 != 0) bad++ } END { exit !(rows == 3 && bad == 0) }' ||
  fail "expected 3 size rows with #wrong 0"
stats h1 sb0
w=$(jq_ sb0 'sum(sum(q["send_wrs"].values()) for q in d["verbs"]["qps"])')
[ "$w" -gt 0 ] || fail "no WRs counted for shunt-bench"
echo "ok: shunt-bench's WRs counted: $w"
