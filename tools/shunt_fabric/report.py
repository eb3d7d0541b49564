"""Looking at a fabric: its links and their counters, hosts and addresses,
a guest's GID index, waiting for a listening port, a guest's console."""
import json
import re
import subprocess
import sys
import time

from .common import FabricError, die, sh
from .hostexec import exec_capture
from .state import State


def link_stats(topo):
    """name -> counters, read on the leaf side of every link."""
    per_ns = {}
    for leaf in topo.leaves:
        per_ns[leaf] = {}
        for _ in range(3):  # a busy host may fail one read; a snapshot should not lose a leaf
            r = sh(["ip", "-n", topo.ns(leaf), "-j", "-s", "link", "show"], check=False, quiet=True)
            try:
                per_ns[leaf] = {d["ifname"]: d for d in json.loads(r.stdout or "")}
                break
            except ValueError:
                time.sleep(0.1)
    out = {}
    for name, l in topo.links().items():
        d = per_ns.get(l["leaf"], {}).get(l["leaf_if"])
        if d is None:
            out[name] = None
            continue
        s = d.get("stats64", {})
        rx, tx = s.get("rx", {}), s.get("tx", {})
        # "up" is toward the spines: host->leaf on a host link, leaf->spine on an uplink.
        if l["kind"] == "host":
            up, down = rx, tx
        else:
            up, down = tx, rx
        out[name] = {"up_bytes": up.get("bytes", 0), "down_bytes": down.get("bytes", 0),
                     "up_packets": up.get("packets", 0), "down_packets": down.get("packets", 0),
                     "oper": d.get("operstate", "?")}
    return out


def cmd_counters(a):
    st = State(a.name)
    topo = st.load()
    stats = link_stats(topo)
    spines = {s: 0 for s in topo.spines}
    for name, c in stats.items():
        l = topo.links()[name]
        if c and l["kind"] == "uplink":
            spines[l["spine"]] += c["up_bytes"] + c["down_bytes"]
    if a.json:
        json.dump({"links": stats, "spines": {s: {"bytes": b} for s, b in spines.items()}},
                  sys.stdout, indent=1, sort_keys=True)
        print()
        return
    print("%-12s %14s %14s %10s %10s" % ("LINK", "UP_BYTES", "DOWN_BYTES", "UP_PKTS", "DOWN_PKTS"))
    for name, c in stats.items():
        if c is None:
            print("%-12s %14s" % (name, "-"))
        else:
            print("%-12s %14d %14d %10d %10d" % (name, c["up_bytes"], c["down_bytes"],
                                                 c["up_packets"], c["down_packets"]))
    for s, b in spines.items():
        print("%-12s %14d (bytes through the spine, both directions)" % (s, b))


def cmd_links(a):
    st = State(a.name)
    topo = st.load()
    faults = st.faults()
    stats = link_stats(topo)
    rows = {}
    for name, l in topo.links().items():
        f = faults.get(name, {})
        state = []
        if f.get("down"):
            state.append("down")
        if f.get("blackhole"):
            state.append("blackhole")
        if l["kind"] == "host" and faults.get(name, {}).get("port_down"):
            state.append("port-down")
        if f.get("loss"):
            state.append("loss %g%%" % f["loss"])
        rows[name] = {"kind": l["kind"], "a": l["a"], "b": l["b"],
                      "state": ",".join(state) or "up", "rate_mbit": f.get("rate"),
                      "oper": (stats.get(name) or {}).get("oper", "?")}
    if a.json:
        json.dump(rows, sys.stdout, indent=1, sort_keys=True)
        print()
        return
    print("%-12s %-7s %-10s %-10s %-16s %s" % ("LINK", "KIND", "END_A", "END_B", "STATE", "RATE"))
    for name, r in rows.items():
        print("%-12s %-7s %-10s %-10s %-16s %s" % (name, r["kind"], r["a"], r["b"], r["state"],
                                                  "%g mbit" % r["rate_mbit"] if r["rate_mbit"] else "-"))


def cmd_hosts(a):
    st = State(a.name)
    topo = st.load()
    rows = []
    for h in topo.hosts:
        for r in range(topo.rails):
            rows.append({"host": h, "nic": "r%d" % r, "addr": topo.host_addr(h, r),
                         "gateway": topo.port_addr(h, r), "leaf": topo.leaf_of(h, r),
                         "rdma": "rxe%d" % r if topo.cfg["kind"] == "vm" else None,
                         "netns": topo.ns(h)})
    if a.json:
        json.dump({"kind": topo.cfg["kind"], "hosts": rows}, sys.stdout, indent=1)
        print()
        return
    for r in rows:
        print("%-4s %-3s %-15s %-6s %-6s %s" % (r["host"], r["nic"], r["addr"], r["rdma"] or "-",
                                                r["leaf"], r["netns"]))


def cmd_addr(a):
    st = State(a.name)
    topo = st.load()
    if a.host not in topo.hosts:
        die("no host %s" % a.host)
    print(topo.host_addr(a.host, int(a.nic.lstrip("r"))))


GID_SCRIPT = r"""
p=/sys/class/infiniband/$1/ports/1
for g in $p/gids/*; do
  i=${g##*/}
  case $(cat $g) in 0000:0000:0000:0000:0000:ffff:*)
    [ "$(cat $p/gid_attrs/types/$i 2>/dev/null)" = "RoCE v2" ] && { echo $i; exit 0; } ;;
  esac
done
exit 1
"""


def cmd_gid(a):
    st = State(a.name)
    topo = st.load()
    rc, out, err = exec_capture(topo, st, a.host, ["sh", "-c", GID_SCRIPT, "gid", a.dev], timeout=30)
    if rc != 0:
        die("no IPv4 RoCEv2 GID on %s %s %s" % (a.host, a.dev, err.strip()))
    print(out.strip())


# Something listens on the port: a TCP socket, or an rdma_cm id (perftest -R,
# rdma_cm servers), which ss does not show but `rdma resource` does.
WAIT_PORT_SCRIPT = r"""
until ss -ltn | grep -q ":$1 " || rdma resource show cm_id 2>/dev/null | grep -q "LISTEN.*:$1\b"; do
  sleep 0.2
done
"""


def cmd_wait_port(a):
    st = State(a.name)
    topo = st.load()
    if a.host not in topo.hosts:
        die("no host %s" % a.host)
    rc, _, _ = exec_capture(topo, st, a.host, ["timeout", str(a.timeout), "sh", "-c", WAIT_PORT_SCRIPT,
                                              "wait-port", str(a.port)], timeout=a.timeout + 30)
    if rc != 0:
        # What runs and listens there: a server that exited, one still
        # starting and one that never started read differently.
        try:
            _, out, err = exec_capture(topo, st, a.host, ["timeout", "10", "sh", "-c",
                                                          "ps -eo pid,ppid,stat,etime,wchan:24,args; ss -ltnp"],
                                       timeout=40)
        except (FabricError, subprocess.TimeoutExpired) as e:
            out, err = "", str(e)
        lines = [l[:200] for l in (out + err).splitlines() if not re.search(r" \[.*\]$", l)]  # no kernel threads
        sys.stderr.write("--- %s's processes and TCP listeners:\n%s\n" % (a.host, "\n".join(lines[-40:])))
        die("nothing listens on %s port %d after %d s" % (a.host, a.port, a.timeout))


def cmd_console(a):
    st = State(a.name)
    with open(st.path(a.host + ".console"), "rb") as f:
        sys.stdout.buffer.write(f.read())
