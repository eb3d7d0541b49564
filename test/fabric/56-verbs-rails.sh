#!/usr/bin/env bash
# timeout: 480
# Bundles across rails: on 2 guests with 2 NICs each (rxe0 on rail 0, rxe1
# on rail 1), a job over rxe0 gets shadow paths on rxe1 too (shunt's mirror
# PD, MRs and CQs there, the peer's rkeys translated). Then h1's rail-0 port
# goes down for good 3 s in (a carrier loss, as a NIC or cable gone):
# - without libshunt the job fails;
# - with SHUNT_RAILS=own (paths on rxe0 only) shunt holds the work for
#   SHUNT_HOLD_MS and then gives the application its error;
# - with the default (every rail) the two-sided work, WRITE_WITH_IMM (an
#   rkey to translate) and SEND, moves to a path on rxe1: exit 0, no error
#   seen, #wrong 0, and rail 1's links carried the job after the fault.
# Then ibv_rc_pingpong in event mode (-e) over the same fault: a doorbell
# on its CQ wakes it for completions of paths on rxe1.
# Last, h1's rail-0 NIC falls off the PCI bus (the netdev and the rxe
# device's QPs go): the job moves to rxe1 the same way.
. "$(dirname "$0")/lib.sh"
need_guests
BENCH=$B/bin/shunt-bench
up --hosts 2 --rails 2 --spines 2
boot=$(fab addr h1 r1):29916  # the job's bootstrap and the shims' channel ride rail 1
KEY=rails-$$

# run TAG MODE(without|own|all) VERB [FAULT]: rank exit codes in $TMP/TAG.rc.
# FAULT: port (h1's rail-0 port down, up again after the job) or nic (h1's
# rail-0 NIC removed: for good, so last)
run() {
  local tag=$1 mode=$2 verb=$3 fault=${4:-port} r p pids=() env=(env)
  [ "$mode" != without ] && env=(env LD_PRELOAD="$LIB" SHUNT_MODE=active SHUNT_JOB_KEY="$KEY" SHUNT_LOG_LEVEL=info
    SHUNT_PATHS_PER_RAIL=2 SHUNT_RAILS="$mode" SHUNT_HOLD_MS=4000 SHUNT_STATS_FILE=/tmp/$tag-stats.json)
  for r in 1 0; do
    local extra=()
    [ $r = 0 ] && extra=(--ready-file /tmp/$tag.ready)
    fab exec h$((r + 1)) -- timeout 120 "${env[@]}" "$BENCH" --rank $r --world 2 --bootstrap "$boot" \
      --transport verbs -d rxe0 --verb "$verb" -b 256K -e 256K -w 2 -c 1 --seg 64K --duration 14 \
      --stall-timeout 30 --retry-cnt 6 --qp-timeout 14 "${extra[@]}" > "$TMP/$tag.rank$r.out" 2>&1 &
    pids+=($!)
  done
  for _ in $(seq 300); do fab exec h1 -- test -e /tmp/$tag.ready 2>/dev/null && break; sleep 0.2; done
  sleep 3
  snap "$tag.before"
  if [ "$fault" = nic ]; then
    fab fault nic-remove h1 r0 >/dev/null || fail "nic-remove h1 r0"
  else
    fab fault port-down h1 r0 >/dev/null || fail "port-down h1 r0"
  fi
  local rc=0
  for p in "${pids[@]}"; do wait "$p" || rc=$?; done
  snap "$tag.after"
  [ "$fault" = port ] && { fab fault port-up h1 r0 >/dev/null || fail "port-up h1 r0"; }
  echo "$tag: exit $rc"
  echo $rc > "$TMP/$tag.rc"
  sleep 2  # rxe0's port active again for the next run
}

ok_run() {  # TAG: survived with no error and #wrong 0
  local out=$TMP/$1.rank0.out rows
  for r in 0 1; do
    ! grep -q "shunt-bench: rank $r: error" "$TMP/$1.rank$r.out" || { cat "$TMP/$1.rank$r.out"; fail "$1: rank $r saw an error"; }
  done
  [ "$(cat $TMP/$1.rc)" = 0 ] || { cat "$TMP/$1.rank0.out" "$TMP/$1.rank1.out"; fail "$1: the job failed"; }
  grep -qE "^# Errors seen +: 0$" "$out" || { cat "$out"; fail "$1: errors seen"; }
  rows=$(awk '$1 ~ /^[0-9]+$/ && NF >= 13' "$out" | wc -l)
  awk '$1 ~ /^[0-9]+$/ && NF >= 13 && $9 != 0 { bad = 1 } END { exit bad }' "$out" && [ "$rows" -ge 1 ] ||
    { cat "$out"; fail "$1: #wrong is not 0 (or no result)"; }
}

# rail_nics TAG: the NICs of h1's paths that carried bytes and are up at the
# end (from SHUNT_STATS_FILE); fails with every path's state when none is on
# rxe1.
rail_nics() {
  local nic
  for _ in 1 2 3; do
    fab exec h1 -- cat "/tmp/$1-stats.json" > "$TMP/s.json" && [ -s "$TMP/s.json" ] && break
    sleep 1
  done
  nic=$(jget "$TMP/s.json" "[p['device'] for q in d['verbs']['qps'] if q.get('bundle') for p in q['bundle']['paths'] if p['bytes'] > 0 and not p['down']]")
  echo "$1: paths that carried bytes and are up, by NIC: $nic"
  [[ "$nic" == *rxe1* ]] && return
  jget "$TMP/s.json" "'\\n'.join(str({k: p.get(k) for k in ('device', 'udp_sport', 'bytes', 'wrs', 'fails', 'down', 'in_flight')}) for q in d['verbs']['qps'] if q.get('bundle') for p in q['bundle']['paths'])"
  fail "$1: no path on rxe1 carried the work"
}

note "without libshunt: h1's rail-0 port down for good"
run base without write_imm
[ "$(cat $TMP/base.rc)" != 0 ] || fail "the job survived without libshunt: the fault missed it"

note "libshunt, SHUNT_RAILS=own: the work is held, then the application gets its error"
run own own write_imm
grep -h "no path came back\|gave up" "$TMP"/own.rank0.out | head -2
[ "$(cat $TMP/own.rc)" != 0 ] || fail "with paths on rxe0 only the job survived a rail lost for good: nothing tested"
grep -q "on other NICs" "$TMP/own.rank0.out" && fail "SHUNT_RAILS=own made paths on other NICs"

for verb in write_imm send; do
  note "libshunt, every rail, $verb"
  run "all-$verb" all "$verb"
  out=$TMP/all-$verb.rank0.out
  grep -h "bundle active\|moved\|went down" "$out" | head -4
  for r in 0 1; do
    grep -q "bundle active with 2 shadow paths (UDP source ports [0-9,]*) and 2 on other NICs (rxe1: " \
      "$TMP/all-$verb.rank$r.out" || { cat "$TMP/all-$verb.rank$r.out"; fail "$verb: rank $r has no paths on rxe1"; }
  done
  ok_run "all-$verb"
  grep -q "moved" "$out" || { cat "$out"; fail "$verb: the two-sided work never moved (the fault missed it?)"; }
  # The job's bytes after the fault crossed h1's rail-1 link.
  rx=$(delta "all-$verb.before" "all-$verb.after" h1-r1 up_bytes)
  echo "$verb: h1's rail-1 link sent $rx bytes from the fault to the end"
  [ "$rx" -gt 4000000 ] || { grep -h "moved\|failed" "$out" | tail -n 6
    fail "$verb: rail 1 carried $rx bytes after the fault, want the job's traffic"; }
  rail_nics "all-$verb"
done
note "ibv_rc_pingpong -e (event mode) with every rail: h1's rail-0 link black-holed for good midway"
# Completions of rail paths land on shunt's mirror CQ; a doorbell on the
# application's CQ (a zero-length WRITE of a QP looped back on rxe0) wakes
# the application waiting on its channel. Without it the client would wait
# for its next event forever once the work moved to rxe1.
gid=$(fab gid h1 rxe0)
pp_env=(env LD_PRELOAD="$LIB" SHUNT_MODE=active SHUNT_JOB_KEY="$KEY" SHUNT_LOG_LEVEL=info SHUNT_PATHS_PER_RAIL=1)
fab exec h2 -- timeout 120 "${pp_env[@]}" ibv_rc_pingpong -d rxe0 -g "$gid" -e -n 3000 -s 4096 > "$TMP/ppe.srv" 2>&1 &
srv=$!
wait_port h2 18515 "$TMP/ppe.srv"
fab exec h1 -- timeout 120 "${pp_env[@]}" ibv_rc_pingpong -d rxe0 -g "$gid" -e -n 3000 -s 4096 "$(fab addr h2 r0)" \
  > "$TMP/ppe.cli" 2>&1 &
cli=$!
for _ in $(seq 100); do grep -q "bundle active" "$TMP/ppe.cli" 2>/dev/null && break; sleep 0.1; done
sleep 1
fab fault blackhole h1-r0 >/dev/null || fail "blackhole h1-r0"
crc=0 src=0
wait $cli || crc=$?
wait $srv || src=$?
fab fault unblackhole h1-r0 >/dev/null || fail "unblackhole h1-r0"
grep -h "bundle active\|moved" "$TMP/ppe.cli" | head -3
[ $crc = 0 ] && [ $src = 0 ] || { cat "$TMP/ppe.cli" "$TMP/ppe.srv"; fail "ibv_rc_pingpong -e: client exit $crc, server exit $src"; }
grep -q "24576000 bytes in" "$TMP/ppe.cli" || { cat "$TMP/ppe.cli"; fail "ibv_rc_pingpong -e did not finish its 3000 iterations"; }
grep -q "and 1 on other NICs (rxe1: " "$TMP/ppe.cli" || { cat "$TMP/ppe.cli"; fail "ibv_rc_pingpong -e: no path on rxe1"; }
grep -q "moved" "$TMP/ppe.cli" || { cat "$TMP/ppe.cli"; fail "ibv_rc_pingpong -e: the work never moved (the fault came too late?)"; }
echo "ok: event mode carried on over rxe1 ($(grep 'bytes in' "$TMP/ppe.cli"))"
sleep 2

note "libshunt, every rail, send: h1's rail-0 NIC falls off the bus"
run nic all send nic
grep -h "failed\|moved" "$TMP/nic.rank0.out" | head -4
ok_run nic
grep -q "moved" "$TMP/nic.rank0.out" || { cat "$TMP/nic.rank0.out"; fail "nic: the work never moved"; }
rail_nics nic
# The removal completes once the job has closed rxe0 (it ended above).
for _ in $(seq 150); do fab exec h1 -- test -e /sys/class/infiniband/rxe0 2>/dev/null || break; sleep 0.2; done
! fab exec h1 -- test -e /sys/class/infiniband/rxe0 2>/dev/null || fail "nic: rxe0 was still there 30 s after the job ended"
echo "ok: a rail lost for good (port down, NIC removed) moves the job to the other NIC, with no error and no wrong byte"
