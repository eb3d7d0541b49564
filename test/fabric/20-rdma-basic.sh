#!/usr/bin/env bash
# timeout: 300
# Soft-RoCE guests: rxe on both rails, ib_write_bw over each rail across a
# spine, ibv_rc_pingpong, QPs with distinct UDP source ports spread over the
# spines, libfabric's verbs provider, concurrent execs, clean teardown.
. "$(dirname "$0")/lib.sh"
need_guests
up --hosts 2 --rails 2 --spines 2

note "rxe devices on both rails"
for h in h1 h2; do
  out=$(gexec $h rdma link) || fail "rdma link on $h"
  echo "$h: $out"
  for r in 0 1; do
    echo "$out" | grep -q "rxe$r/1 state ACTIVE .*netdev r$r" || fail "$h has no active rxe$r on r$r"
  done
done
note "guests: full preemption, permanent neighbours on both sides of every tap"
# Without them rxe's send loop in ibv_post_send could hold a guest's one CPU
# while the ARP reply it waited for sat in a starved softirq (docs/fabric.md).
for h in h1 h2; do
  gexec $h cat /proc/cmdline | grep -qw 'preempt=full' || fail "$h: no preempt=full on the kernel command line"
  gexec $h dmesg | grep -q 'Dynamic Preempt: full' || fail "$h: the kernel does not preempt fully"
  for r in 0 1; do
    gw=$(fab addr $h r$r | sed 's/\.2$/.1/')
    gexec $h ip neigh show "$gw" dev r$r | grep -q PERMANENT || fail "$h r$r: the neighbour $gw is not permanent"
    ip -n "sf-$NAME-l${h#h}r$r" neigh show "$(fab addr $h r$r)" dev $h | grep -q PERMANENT ||
      fail "leaf l${h#h}r$r: the neighbour $(fab addr $h r$r) is not permanent"
  done
done

gid=$(fab gid h1 rxe0) || fail "no IPv4 GID on h1 rxe0"
echo "IPv4 RoCEv2 GID index: $gid"

note "exec: exit status, stderr, cwd, env"
gexec h1 sh -c 'exit 7'; [ $? = 7 ] || fail "exit status not passed back"
[ "$(fab exec h1 -- sh -c 'echo err >&2' 2>&1 >/dev/null)" = err ] || fail "stderr not passed back"
[ "$(cd "$ROOT" && fab exec h1 -- pwd)" = "$ROOT" ] || fail "cwd not kept"
[ "$(fab exec -e SHUNT_X=42 h1 -- sh -c 'echo $SHUNT_X')" = 42 ] || fail "env not passed"

# write_bw RAIL CLIENT_OUT [ARGS...]: ib_write_bw h1 -> h2 on one rail
write_bw() {
  local r=$1 out=$2; shift 2
  local dst; dst=$(fab addr h2 r$r)
  gexec h2 ib_write_bw -d rxe$r -F -x "$gid" "$@" > "$TMP/srv" 2>&1 &
  local srv=$!
  wait_port h2 18515 "$TMP/srv"
  gexec h1 ib_write_bw -d rxe$r -F -x "$gid" "$@" "$dst" > "$out" 2>&1
  local rc=$?
  wait $srv || rc=1
  return $rc
}

for r in 0 1; do
  note "ib_write_bw over rail $r"
  snap a
  write_bw $r "$TMP/bw$r" -n 300 || { cat "$TMP/bw$r" "$TMP/srv"; fail "ib_write_bw rail $r"; }
  snap b
  bw=$(bw_avg "$TMP/bw$r")
  echo "rail $r: $bw MB/s"
  awk -v b="$bw" 'BEGIN { exit !(b > 1) }' || fail "rail $r bandwidth $bw MB/s"
  sp=$(($(delta a b l1r$r-s1 up_bytes) + $(delta a b l1r$r-s2 up_bytes)))
  [ $sp -ge 19000000 ] || fail "rail $r: only $sp B crossed the spines"
  [ "$(delta a b h2-r$r down_bytes)" -ge 19000000 ] || fail "rail $r: data did not reach h2"
  other=$((1 - r))
  [ "$(delta a b h1-r$other up_bytes)" -lt 100000 ] || fail "rail $r traffic went out r$other"
done

note "one QP stays on one spine"
snap a; write_bw 0 "$TMP/one" -n 200 || fail "single-QP ib_write_bw"; snap b
s1=$(delta a b l1r0-s1 up_bytes); s2=$(delta a b l1r0-s2 up_bytes)
echo "1 QP: s1 $s1 B, s2 $s2 B"
[ $((s1 * 10)) -le $((s1 + s2)) ] || [ $((s2 * 10)) -le $((s1 + s2)) ] ||
  fail "one QP split over both spines ($s1, $s2)"

note "8 QPs (8 UDP source ports) use both spines"
# 8 QPs of 4 writes of 8 KiB in flight each: at perftest's default depth
# (128 writes of 64 KiB per QP) the receiving guest's rxe, on an emulated
# CPU beside other load, let about one datagram in six that UDP handed it go
# uncounted; go-back-N resent tens of thousands and rxe 6.1 ended the run
# with a remote invalid request completion (status 9), in a CI run and in 4
# of 5 loaded runs here (docs/fabric.md). At this depth no packet was lost.
# The spine hash is seeded at random, so 8 flows land on one spine 1 time in
# 128: one more run with fresh QPNs makes a false failure 1 in 16384.
for try in 1 2; do
  snap a; write_bw 0 "$TMP/many" -q 8 -n 100 -s 8192 -t 4 ||
    { cat "$TMP/many" "$TMP/srv"; fail "ib_write_bw -q 8"; }
  snap b
  s1=$(delta a b l1r0-s1 up_bytes); s2=$(delta a b l1r0-s2 up_bytes)
  echo "8 QPs: s1 $s1 B, s2 $s2 B"
  [ $((s1 * 20)) -ge $((s1 + s2)) ] && [ $((s2 * 20)) -ge $((s1 + s2)) ] && break
  [ $try = 2 ] && fail "8 QPs did not spread over both spines ($s1, $s2)"
done

note "ibv_rc_pingpong"
gexec h2 ibv_rc_pingpong -d rxe0 -g "$gid" -n 200 > "$TMP/pp_srv" 2>&1 &
srv=$!
wait_port h2 18515 "$TMP/pp_srv"
gexec h1 ibv_rc_pingpong -d rxe0 -g "$gid" -n 200 "$(fab addr h2 r0)" > "$TMP/pp" 2>&1 ||
  { cat "$TMP/pp"; fail "ibv_rc_pingpong client"; }
wait $srv || { cat "$TMP/pp_srv"; fail "ibv_rc_pingpong server"; }
grep 'iters in' "$TMP/pp"

note "fi_pingpong over libfabric's verbs provider"
gexec h2 fi_pingpong -p verbs -e msg -I 100 -S 4096 > "$TMP/fi_srv" 2>&1 &
srv=$!
wait_port h2 47592 "$TMP/fi_srv"
gexec h1 fi_pingpong -p verbs -e msg -I 100 -S 4096 "$(fab addr h2 r0)" > "$TMP/fi" 2>&1 ||
  { cat "$TMP/fi" "$TMP/fi_srv"; fail "fi_pingpong client"; }
wait $srv || { cat "$TMP/fi_srv"; fail "fi_pingpong server"; }
cat "$TMP/fi"

note "down leaves no namespace, tap or qemu"
pids=$(awk '{ print $2 }' "/run/shunt-fabric/$NAME/pids")
fab down
ip netns list | grep -q "^sf-$NAME-" && fail "namespaces left after down"
ip -o link show | grep -Eq ": h[0-9]+r[0-9]+[:@]" && fail "a tap is left in the initial namespace"
for p in $pids; do [ -e /proc/$p ] && fail "pid $p still runs after down"; done
[ -e "/run/shunt-fabric/$NAME" ] && fail "state left after down"
echo "ok"
