#!/usr/bin/env bash
# timeout: 60
# Spoofed and malformed probes change no estimate: two hosts sync while a
# third namespace floods one of them with garbage, truncated probes and well
# formed probes signed with the wrong key, all carrying absurd timestamps.
# Every spoofed datagram must be counted as dropped and the estimates must
# stay within their bounds of the truth.
set -u
cd "$(dirname "$0")/../.."
. test/e2e/clocksync_lib.bash
BIN=${BUILD:-build}/bin/shunt-probe
[ -x "$BIN" ] || { echo "build $BIN first"; exit 77; }
cs_need_root
trap cs_cleanup EXIT
OUT=$(mktemp -d /tmp/clocksync-spoof.XXXXXX)
cs_mesh 3 1
EPOCH=$(date +%s%N)
export SHUNT_JOB_KEY=clocksync-spoof-secret
ip netns exec "$(cs_ns h1)" "$BIN" --name h1 --listen "$(cs_addr 1 0)" --peer "h2=$(cs_addr 2 0)" \
  --test-clock "offset=0,epoch=$EPOCH" --shm "" --duration 10 --json "$OUT/h1.json" --quiet &
CS_PIDS+=($!); P1=$!
ip netns exec "$(cs_ns h2)" "$BIN" --name h2 --listen "$(cs_addr 2 0)" --peer "h1=$(cs_addr 1 0)" \
  --test-clock "offset=700000,drift=-60000,epoch=$EPOCH" --shm "" --duration 10 --json "$OUT/h2.json" --quiet &
CS_PIDS+=($!); P2=$!
sleep 3
# The attacker (host 3) knows the format and h1/h2's names, not the key; it
# also spoofs h2's source address where the kernel lets it (same subnet: no).
ip netns exec "$(cs_ns h3)" python3 - "$(cs_addr 1 0)" > "$OUT/spoof.txt" <<'PY'
import hashlib, os, random, socket, struct, sys, time
dst = (sys.argv[1], 7471)
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
def nid(name):
    v = int.from_bytes(hashlib.blake2b(name.encode(), digest_size=8).digest(), "little")
    return v or 1
def probe(key, seq, stamp):
    body = struct.pack("<HBBBBBB", 0x5348, 1, 1, 0, seq & 1, 2, 0)
    body += struct.pack("<QQQq", nid("h2"), nid("h1"), seq, stamp)
    body += struct.pack("<Qqq", (seq - 1) % 2**64, stamp - 10**9, stamp - 10**9 + 5)
    for i in range(2):
        body += struct.pack("<QqqII", (seq - i) % 2**64, stamp + 10**8, stamp + 10**8 + 5, 1000, 0)
    return body + hashlib.blake2b(body, digest_size=16, key=key).digest()
n = 0
end = time.time() + 4
while time.time() < end:
    k = random.randrange(4)
    if k == 0: pkt = os.urandom(random.randrange(1, 600))           # garbage
    elif k == 1: pkt = probe(os.urandom(32), random.randrange(2**40), random.randrange(2**62))  # wrong key
    elif k == 2: pkt = probe(b"\0" * 32, n, 4 * 10**18)[:random.randrange(1, 143)]              # truncated
    else:
        p = bytearray(probe(os.urandom(32), n, 10**18)); p[2] = 9; pkt = bytes(p)                   # bad version
    s.sendto(pkt, dst)
    n += 1
    if n % 200 == 0: time.sleep(0.01)
print(n)
PY
wait $P1 || exit 1
wait $P2 || exit 1
SENT=$(cat "$OUT/spoof.txt")
python3 - "$OUT/h1.json" "$OUT/h2.json" "$SENT" <<'PY' || exit 1
import json, sys
r = json.load(open(sys.argv[1])); h2 = json.load(open(sys.argv[2])); sent = int(sys.argv[3])
c = r["counters"]
# The flood carries h2's name but not the key: it is dropped as forged
# (auth) or malformed, or as unknown. Replays are h2's own probes: a pair
# that reaches h1 before h1 has sent a pair of its own names none of h1's,
# so it is heard, not taken, and counted with the replays.
spoof = c["dropped_auth"] + c["dropped_malformed"] + c["dropped_unknown"]
replay = c["dropped_replay"]
accepted = c["received"] - spoof - replay
sent_h2 = h2["counters"]["sent"]
print(f"spoofed {sent}, reached h1 and dropped {spoof} (auth {c['dropped_auth']}, "
      f"malformed {c['dropped_malformed']}, unknown {c['dropped_unknown']}); "
      f"h2 sent {sent_h2}: accepted {accepted}, heard not taken {replay}")
# Some of the flood may overflow the socket buffer; what got in must all be
# dropped: h1 takes no more probes than h2 really sent it. And the flood
# does not crowd out h2's genuine probes (the engine reads as they arrive
# under a flood, not only when something is due).
ok = sent * 0.5 <= spoof <= sent and accepted + replay <= sent_h2 and sent_h2 * 0.85 <= accepted
sys.exit(0 if ok else 1)
PY
python3 test/e2e/clocksync_check.py --settle 4 "$OUT"/h1.json "$OUT"/h2.json
rc=$?
[ $rc = 0 ] && rm -rf "$OUT" || echo "results kept in $OUT"
exit $rc
