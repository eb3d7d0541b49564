#!/usr/bin/env bash
# timeout: 420
# Every fault kind against a live RoCEv2 flow between two guests, and the
# baseline an unmodified ib_write_bw shows when a link it uses goes down.
. "$(dirname "$0")/lib.sh"
need_guests
up --hosts 2 --rails 2 --spines 2
gid=$(fab gid h1 rxe0) || fail "no IPv4 GID on h1 rxe0"
dst=$(fab addr h2 r0)

# flow_start: an endless single-QP ib_write_bw h1 -> h2 on rail 0. -F: each
# second's report re-measures the CPU clock, and on a busy guest that
# sample fails (r^2 < 0.9), which without -F ends perftest ("Can't produce
# a report"); the flow is measured on the links, not by its reports.
flow_start() {
  "$FABRIC" --name "$NAME" exec h2 -- timeout 300 ib_write_bw -d rxe0 -x "$gid" \
    --run_infinitely -D 1 -F > "$TMP/flow_srv" 2>&1 &
  flow_srv=$!
  wait_port h2 18515 "$TMP/flow_srv"
  "$FABRIC" --name "$NAME" exec h1 -- timeout 300 ib_write_bw -d rxe0 -x "$gid" \
    --run_infinitely -D 1 -F "$dst" > "$TMP/flow_cli" 2>&1 &
  flow_cli=$!
}
flow_fail() { echo "client's last lines:"; tail -n 4 "$TMP/flow_cli"; fail "$*"; }
flow_stop() { kill $flow_cli $flow_srv 2>/dev/null; wait $flow_cli $flow_srv 2>/dev/null; }

# moved SECONDS LINK FIELD: counter change over that many seconds
moved() { snap m0; sleep "$1"; snap m1; delta m0 m1 "$2" "$3"; }

# resumes: waits (up to 40 s) until data reaches h2 again; prints seconds
resumes() {
  local t0=$SECONDS
  while [ $((SECONDS - t0)) -lt 40 ]; do
    [ "$(moved 1 h2-r0 down_bytes)" -gt 500000 ] && { echo $((SECONDS - t0)); return 0; }
  done
  return 1
}

port_state() { fab exec "$1" -- cat "/sys/class/infiniband/$2/ports/1/state"; }

note "a single-QP flow and the spine it hashes to"
flow_start
sleep 4
snap a; sleep 2; snap b
s1=$(delta a b l1r0-s1 up_bytes); s2=$(delta a b l1r0-s2 up_bytes)
echo "flow: s1 $s1 B, s2 $s2 B in 2 s"
if [ "$s1" -gt "$s2" ]; then on=s1 off=s2; else on=s2 off=s1; fi
[ $(($s1 + $s2)) -gt 2000000 ] || { cat "$TMP/flow_cli"; fail "the flow does not run"; }

note "blackhole l1r0-$on: the flow's spine drops everything, nothing changes state"
fab fault blackhole l1r0-$on
sleep 1
snap a; sleep 3; snap b
# ARP is not IP: a neighbour probe or two may still cross (42 B each)
v=$(delta a b l1r0-$on up_bytes); [ "$v" -lt 1000 ] || fail "$v B crossed the black-holed link"
[ "$(delta a b h2-r0 down_bytes)" -lt 50000 ] || fail "data still reaches h2 through a blackhole"
[ "$(fab exec h1 -- cat /sys/class/net/r0/carrier)" = 1 ] || fail "blackhole changed h1's carrier"
port_state h1 rxe0 | grep -q ACTIVE || fail "blackhole changed h1's port state"
fab fault unblackhole l1r0-$on
t=$(resumes) || flow_fail "flow did not resume after the blackhole"
echo "flow resumed ${t}s after unblackhole"

note "link-down h1-r0: silent loss, the guest keeps carrier and port"
fab fault link-down h1-r0
sleep 1
[ "$(fab exec h1 -- cat /sys/class/net/r0/carrier)" = 1 ] || fail "guest lost carrier on a silent link-down"
port_state h1 rxe0 | grep -q ACTIVE || fail "guest port left ACTIVE on a silent link-down"
v=$(moved 3 h2-r0 down_bytes); [ "$v" -lt 1000 ] || fail "$v B passed a downed host link"
fab fault link-up h1-r0
t=$(resumes) || flow_fail "flow did not resume after link-up"
echo "flow resumed ${t}s after link-up"

note "rate h1-r0 16 Mbit/s caps the flow"
free=$(moved 3 h2-r0 down_bytes)
fab fault rate h1-r0 16
# swapping the guest's root qdisc under a running QP costs a retry stall
t=$(resumes) || flow_fail "flow did not resume after the rate change"
echo "flow resumed ${t}s after the rate change"
capped=$(moved 3 h2-r0 down_bytes)
fab fault rate h1-r0 0
echo "3 s of flow: free $free B, capped at 16 Mbit/s $capped B"
[ "$capped" -le 7800000 ] || fail "16 Mbit/s let $capped B through in 3 s"
[ "$capped" -gt 0 ] || fail "the capped flow stopped"
flow_stop

note "port-down: the guest sees carrier loss and the port go down"
fab fault port-down h1 r0
sleep 1
[ "$(fab exec h1 -- cat /sys/class/net/r0/carrier)" = 0 ] || fail "no carrier loss on port-down"
port_state h1 rxe0 | grep -q DOWN || fail "rxe0 port not DOWN: $(port_state h1 rxe0)"
fab exec h1 -- ibv_devinfo -d rxe0 | grep -q PORT_DOWN || fail "ibv_devinfo does not show PORT_DOWN"
fab fault port-up h1 r0
for i in $(seq 50); do port_state h1 rxe0 | grep -q ACTIVE && break; sleep 0.2; done
port_state h1 rxe0 | grep -q ACTIVE || fail "rxe0 not ACTIVE after port-up"

note "rdma-remove / rdma-add"
fab fault rdma-remove h1 rxe1 || fail "rdma-remove"
fab exec h1 -- rdma link | grep -q rxe1 && fail "rxe1 still there after rdma-remove"
fab exec h1 -- test -e /sys/class/infiniband/rxe1 && fail "rxe1 still in sysfs"
fab fault rdma-add h1 rxe1 r1 || fail "rdma-add"
fab exec h1 -- rdma link | grep -q 'rxe1/1 state ACTIVE' || fail "rxe1 not back"

note "flap h1-r0: the guest never sees it"
fab fault flap h1-r0 --period 400 --count 3 || fail "flap"
[ "$(fab exec h1 -- cat /sys/class/net/r0/carrier)" = 1 ] || fail "flap reached the guest's carrier"

note "baseline: unmodified ib_write_bw, RC retry_cnt 7 (perftest default), host link down 12 s"
"$FABRIC" --name "$NAME" exec h2 -- timeout 120 ib_write_bw -d rxe0 -x "$gid" -n 1500 > "$TMP/b_srv" 2>&1 &
srv=$!
wait_port h2 18515 "$TMP/b_srv"
t0=$(date +%s.%N)
"$FABRIC" --name "$NAME" exec h1 -- timeout 120 ib_write_bw -d rxe0 -x "$gid" -n 1500 "$dst" > "$TMP/b_cli" 2>&1 &
cli=$!
sleep 3
fab fault link-down h1-r0
sleep 12
kill -0 $cli 2>/dev/null && alive=yes || alive=no
fab fault link-up h1-r0
wait $cli; rc=$?
t1=$(date +%s.%N)
wait $srv
echo "BASELINE retry_cnt=7: after 12 s down the client was alive=$alive (no error);" \
  "after link-up it exited $rc, the run took $(python3 -c "print(round($t1 - $t0, 1))") s for 1500 x 64 KiB;" \
  "completer retries: $(fab exec h1 -- cat /sys/class/infiniband/rxe0/ports/1/hw_counters/completer_retry_err)"
grep -E '^ *65536|Failed' "$TMP/b_cli"
[ $alive = yes ] || fail "expected ib_write_bw to hang (rxe treats retry_cnt 7 as infinite)"

note "baseline: ib_write_bw over rdma_cm with --retry_count=3, host link down"
"$FABRIC" --name "$NAME" exec h2 -- timeout 60 ib_write_bw -R -d rxe0 -n 100000 > "$TMP/r_srv" 2>&1 &
srv=$!
wait_port h2 18515 "$TMP/r_srv"
"$FABRIC" --name "$NAME" exec h1 -- timeout 60 ib_write_bw -R --retry_count=3 -d rxe0 -n 100000 "$dst" > "$TMP/r_cli" 2>&1 &
cli=$!
sleep 3
fab fault link-down h1-r0
t0=$(date +%s.%N)
wait $cli; rc=$?
t1=$(date +%s.%N)
kill $srv 2>/dev/null; wait $srv 2>/dev/null
fab fault link-up h1-r0
took=$(python3 -c "print(round($t1 - $t0, 1))")
echo "BASELINE retry_count=3: client exited $rc ${took} s after link-down: $(grep -E 'Failed status' "$TMP/r_cli")"
grep -q 'Failed status 12' "$TMP/r_cli" || { cat "$TMP/r_cli"; fail "expected IBV_WC_RETRY_EXC_ERR (12)"; }
echo "ok"
