#!/usr/bin/env bash
# route-hops (path discovery; any process of the host may ask) costs the
# agent's process bounded sockets and memory: requests for many distinct
# peers start a few discoveries at a time and hear "busy" beyond them, and
# malformed addresses (1 MiB strings among them) are refused before
# anything is kept. The agent runs in a namespace of its own whose
# datagrams go to a gateway that takes them silently (a veth link into a
# second namespace, the gateway a static neighbour there: no router
# answers), with 1024 fds as a job's rank often has. (Each request started a discovery holding a socket
# per candidate, 256 each: 20 requests used every fd the job had; and every
# distinct peer string was kept for good.)
# timeout: 60
. "$(dirname "$0")/../lib.sh"
[ "$(id -u)" = 0 ] || skip "needs root (a network namespace)"
ns=svc-hops-$$ sink=svc-sink-$$
ip netns add "$ns" 2>/dev/null || skip "cannot create network namespaces here"
at_exit "ip netns del $ns 2>/dev/null"
ip netns add "$sink"
at_exit "ip netns del $sink 2>/dev/null"
ip -n "$ns" link set lo up
ip link add v0 netns "$ns" type veth peer name v1 netns "$sink" || fail "cannot make a veth pair"
ip -n "$ns" addr add 10.99.0.1/24 dev v0
ip -n "$ns" link set v0 up
ip -n "$sink" link set v1 up
ip -n "$ns" neigh add 10.99.0.2 lladdr 02:00:00:00:00:02 dev v0 nud permanent
ip -n "$ns" route add 10.99.1.0/24 via 10.99.0.2 dev v0

export SHUNT_RUN_DIR=$TMP/run SHUNT_MODE=observe
mkdir -p "$SHUNT_RUN_DIR"
ip netns exec "$ns" bash -c 'ulimit -n 1024 && exec env LD_PRELOAD="$0" "$1" 50000' "$LIB" "$B/test/hold_socket" &
agent=$!
at_exit "kill $agent 2>/dev/null"
for i in $(seq 1 50); do [ -S "$SHUNT_RUN_DIR/agent.sock" ] && break; sleep 0.1; done
"$B/bin/shuntctl" status --json > "$TMP/s" || fail "no agent answers"
expect_eq "$(jget "$TMP/s" 'd["agent_pid"]')" "$agent" "the process in the namespace is the agent"

python3 - "$SHUNT_RUN_DIR/agent.sock" "$agent" <<'PY' || fail "route-hops is not bounded"
import json, os, socket, sys, time
sock, pid = sys.argv[1], sys.argv[2]

def ask(req):
    s = socket.socket(socket.AF_UNIX)
    s.settimeout(10)
    s.connect(sock)
    s.sendall(json.dumps(req).encode() + b"\n")
    line = s.makefile("rb").readline()
    s.close()
    return json.loads(line)

def fds():
    return len(os.listdir(f"/proc/{pid}/fd"))

def rss_kb():
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1])

base_fds, base_rss = fds(), rss_kb()
# 25 distinct peers, 256 candidates each, waiting 5 s for routers.
answers = {}
most = base_fds
for i in range(25):
    a = ask({"cmd": "route-hops", "local": "10.99.0.1", "peer": f"10.99.1.{i + 1}", "candidates": 256, "wait_ms": 5000})
    key = "busy" if a.get("busy") else "pending" if a.get("pending") else json.dumps(a)[:80]
    answers[key] = answers.get(key, 0) + 1
    most = max(most, fds())
end = time.time() + 0.5
while time.time() < end:
    most = max(most, fds())
    time.sleep(0.05)
print("distinct peers:", answers, f"fds: {base_fds} at first, then at most {most}")
assert most - base_fds <= 300, f"{most - base_fds} fds more"
assert set(answers) <= {"busy", "pending"}, answers
assert answers.get("busy", 0) > 0, "no request was turned away"
# Malformed addresses, 40 of them 1 MiB long and each one different.
bad = [f"10.99.0.{i}" + "7" * (1 << 20) for i in range(40)]
bad += ["999.1.1.1", "10.99.0", "::1", "10.99.0.1 ", "010.99.0.1", "", 5, None, ["10.99.0.1"]]
refused = 0
for i, p in enumerate(bad):
    for req in ({"cmd": "route-hops", "local": "10.99.0.1", "peer": p, "candidates": 8, "wait_ms": 100},
                {"cmd": "route-hops", "local": p, "peer": "10.99.0.2", "candidates": 8, "wait_ms": 100}):
        a = ask(req)
        refused += "error" in a
    most = max(most, fds())
print(f"malformed: {refused} of {2 * len(bad)} refused")
assert refused == 2 * len(bad)
end = time.time() + 2
while time.time() < end:
    most = max(most, fds())
    time.sleep(0.05)
grown = rss_kb() - base_rss
print(f"fds: {base_fds} at first, at most {most}; RSS grew {grown} kB")
assert most - base_fds <= 300, f"{most - base_fds} fds more"
assert grown < 16 * 1024, f"RSS grew {grown} kB"
PY
ok "fds and memory bounded"
"$B/bin/shuntctl" status --json > "$TMP/s2" || fail "the agent stopped answering"
ok "the agent still answers"
