#!/usr/bin/env bash
# timeout: 120
# Namespace hosts: routing across spines, L4-hashed ECMP, every fault kind
# that does not need a guest, rate limits, and a clean teardown.
. "$(dirname "$0")/lib.sh"
need_root
up --kind ns --hosts 2 --rails 2 --spines 2

# udp_flows HOST SRCADDR DST NFLOWS: one 1000-byte datagram per source port
udp_flows() {
  fab exec "$1" -- python3 - "$2" "$3" "$4" <<'EOF'
import socket, sys
src, dst, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
for p in range(30000, 30000 + n):
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind((src, p))
    for _ in range(4):
        s.sendto(b"x" * 1000, (dst, 9))
    s.close()
EOF
}

# tcp_bytes SECONDS: bytes h1 pushes to h2 over rail 0 in that time
tcp_bytes() {
  fab exec h2 -- python3 -c '
import socket
l = socket.socket(); l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
l.bind(("10.0.2.2", 5001)); l.listen(1)
c, _ = l.accept()
while c.recv(1 << 16): pass' &
  local srv=$!
  wait_port h2 5001 "" 5
  fab exec h1 -- python3 - "$1" <<'EOF'
import socket, sys, time
s = socket.create_connection(("10.0.2.2", 5001))
end, n, buf = time.time() + float(sys.argv[1]), 0, b"x" * 65536
while time.time() < end:
    n += s.send(buf)
print(n)
EOF
  wait $srv
}

note "link names"
n_host=$(fab links | awk '$2 == "host"' | wc -l)
n_up=$(fab links | awk '$2 == "uplink"' | wc -l)
[ "$n_host" = 4 ] && [ "$n_up" = 8 ] || fail "expected 4 host links and 8 uplinks, got $n_host/$n_up"
fab links | grep -q '^l1r0-s2 ' || fail "no link l1r0-s2"
[ "$(fab addr h2 r1)" = 10.1.2.2 ] || fail "h2 r1 is not 10.1.2.2"

note "ECMP: 64 source ports spread over both spines, one stays on one"
snap a; udp_flows h1 10.0.1.2 10.0.2.2 64; snap b
s1=$(delta a b l1r0-s1 up_bytes); s2=$(delta a b l1r0-s2 up_bytes)
echo "64 flows: s1 $s1 B, s2 $s2 B"
[ $((s1 + s2)) -ge 256000 ] || fail "64 flows did not cross the spines ($s1 + $s2)"
[ $((s1 * 10)) -ge $((s1 + s2)) ] && [ $((s2 * 10)) -ge $((s1 + s2)) ] ||
  fail "ECMP did not spread 64 flows (s1 $s1, s2 $s2)"
snap a; udp_flows h1 10.0.1.2 10.0.2.2 1; snap b
s1=$(delta a b l1r0-s1 up_bytes); s2=$(delta a b l1r0-s2 up_bytes)
[ "$s1" = 0 ] || [ "$s2" = 0 ] || fail "one flow split over both spines ($s1, $s2)"
[ "$(delta a b h2-r0 down_bytes)" -ge 4000 ] || fail "one flow did not reach h2"

note "rail 1 is its own path"
snap a; udp_flows h1 10.1.1.2 10.1.2.2 16; snap b
[ "$(delta a b l1r0-s1 up_bytes)" -lt 2000 ] || fail "rail 1 traffic crossed rail 0's leaf"
[ "$(delta a b h2-r1 down_bytes)" -ge 64000 ] || fail "rail 1 traffic did not reach h2"

note "blackhole: drops on the spine link, no link change"
fab fault blackhole l1r0-s1
fab links | grep -q '^l1r0-s1 .*blackhole' || fail "links does not show the blackhole"
snap a; udp_flows h1 10.0.1.2 10.0.2.2 64; snap b
v=$(delta a b l1r0-s1 up_bytes); [ "$v" -lt 1000 ] || fail "$v B crossed a black-holed link"
got=$(delta a b h2-r0 down_bytes)
[ "$got" -lt 200000 ] && [ "$got" -gt 20000 ] || fail "blackhole: h2 got $got B of 256000"
ip -n "sf-$NAME-l1r0" link show s1 | grep -q 'state UP' || fail "blackhole changed the link state"
fab fault unblackhole l1r0-s1
snap a; udp_flows h1 10.0.1.2 10.0.2.2 64; snap b
[ "$(delta a b l1r0-s1 up_bytes)" -gt 0 ] || fail "unblackhole did not restore s1"

note "link-down of an uplink: the leaf drops that nexthop; link-up restores the routes"
fab fault link-down l1r0-s1
ip -n "sf-$NAME-l1r0" route show 10.0.0.0/8 | grep 's1.*dead' >/dev/null || fail "nexthop s1 not dead"
snap a; udp_flows h1 10.0.1.2 10.0.2.2 32; snap b
[ "$(delta a b l1r0-s1 up_bytes)" = 0 ] || fail "traffic on a downed link"
fab fault link-up l1r0-s1
ip -n "sf-$NAME-s1" route | grep -q '^10.0.1.0/24 via' || fail "spine route not restored"
snap a; udp_flows h1 10.0.1.2 10.0.2.2 64; snap b
[ "$(delta a b l1r0-s1 up_bytes)" -gt 0 ] || fail "link-up did not restore s1"

note "link-down of a host link: silent, the host keeps its carrier"
fab fault link-down h1-r0
ip -n "sf-$NAME-h1" link show r0 | grep -q LOWER_UP || fail "host lost carrier on a silent link-down"
snap a; udp_flows h1 10.0.1.2 10.0.2.2 16; snap b
v=$(delta a b h2-r0 down_bytes); [ "$v" -lt 1000 ] || fail "$v B passed a downed host link"
fab fault link-up h1-r0

note "port-down: the host sees carrier loss"
fab fault port-down h1 r0
ip -n "sf-$NAME-h1" link show r0 | grep -q NO-CARRIER || fail "no carrier loss on port-down"
fab fault port-up h1 r0
sleep 0.2
ip -n "sf-$NAME-h1" link show r0 | grep -q LOWER_UP || fail "port-up did not restore carrier"

note "rate: tbf caps a link"
free=$(tcp_bytes 2)
fab fault rate h1-r0 20
capped=$(tcp_bytes 2)
fab fault rate h1-r0 0
echo "TCP in 2 s: unlimited $free B, 20 Mbit/s $capped B"
[ "$capped" -lt 8000000 ] || fail "20 Mbit/s cap let $capped B through in 2 s"
[ "$free" -gt $((capped * 3)) ] || fail "rate limit made no difference ($free vs $capped)"

note "flap"
t0=$(date +%s%N)
fab fault flap l1r0-s2 --period 200 --count 3 || fail "flap failed"
ms=$((($(date +%s%N) - t0) / 1000000))
[ $ms -ge 600 ] || fail "flap of 3 x 200 ms took $ms ms"
ip -n "sf-$NAME-l1r0" link show s2 | grep -q 'state UP' || fail "flap left the link down"

note "down leaves nothing behind"
fab down
ip netns list | grep -q "^sf-$NAME-" && fail "namespaces left after down"
[ -e "/run/shunt-fabric/$NAME" ] && fail "state left after down"
fab down || fail "second down is not idempotent"
echo "ok"
