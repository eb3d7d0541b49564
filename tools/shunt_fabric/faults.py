"""Faults: links down and up, flaps, blackholes, rate limits, loss, ports
(carrier loss), NICs that fall off the bus, and rxe devices."""
import os
import re
import time

from .common import FabricError, die, sh
from .guests import monitor
from .hostexec import exec_capture
from .network import ip, leaf_port_up, leaf_routes, nsexec, spine_routes
from .state import State


def find_link(topo, name):
    links = topo.links()
    if name not in links:
        die("no link %r (shunt-fabric links --name %s)" % (name, topo.name))
    return links[name]


def link_set(topo, name, up):
    l = find_link(topo, name)
    state = "up" if up else "down"
    leaf_ns = topo.ns(l["leaf"])
    if l["kind"] == "uplink":
        sns = topo.ns(l["spine"])
        ip(leaf_ns, "link", "set", l["leaf_if"], state)
        ip(sns, "link", "set", l["spine_if"], state)
        if up:
            leaf_routes(topo, l["leaf"])
            spine_routes(topo, l["spine"], only_leaf=l["leaf"])
    elif topo.cfg["kind"] == "vm":
        # The leaf's side of the tap: the guest keeps its carrier (silent loss).
        ip(leaf_ns, "link", "set", l["leaf_if"], state)
        if up:
            leaf_port_up(topo, l["host"], l["rail"])
    else:
        # A veth cannot lose one side silently; drop at the leaf instead.
        drop_if(leaf_ns, l["leaf_if"], not up)


def drop_if(ns, ifname, on):
    op = "add" if on else "delete"
    nsexec(ns, "nft", op, "element", "inet", "shunt_fabric", "drop_ifs",
           '{ "%s" }' % ifname, check=False)


def blackhole(topo, name, on):
    l = find_link(topo, name)
    drop_if(topo.ns(l["leaf"]), l["leaf_if"], on)
    if l["kind"] == "uplink":
        drop_if(topo.ns(l["spine"]), l["spine_if"], on)


def tbf(ns, ifname, mbit, exec_host=None, topo=None, st=None, queue_ms=100):
    if mbit:
        burst = max(16000, int(mbit * 125000 / 250))
        argv = ["tc", "qdisc", "replace", "dev", ifname, "root", "tbf", "rate", "%dkbit" % max(1, round(mbit * 1000)),
                "burst", str(burst), "latency", "%dms" % queue_ms]
    else:
        argv = ["tc", "qdisc", "del", "dev", ifname, "root"]
    if exec_host:
        rc, _, err = exec_capture(topo, st, exec_host, argv, timeout=30)
        if rc != 0 and mbit:
            raise FabricError("%s: %s" % (" ".join(argv), err.strip()))
    else:
        nsexec(ns, *argv, check=bool(mbit))


def set_rate(topo, st, name, mbit, faults, queue_ms=100):
    l = find_link(topo, name)
    tbf(topo.ns(l["leaf"]), l["leaf_if"], mbit, queue_ms=queue_ms)
    if l["kind"] == "uplink":
        tbf(topo.ns(l["spine"]), l["spine_if"], mbit, queue_ms=queue_ms)
    elif topo.cfg["kind"] == "ns":
        tbf(topo.ns(l["host"]), "r%d" % l["rail"], mbit, queue_ms=queue_ms)
    else:
        tbf(None, "r%d" % l["rail"], mbit, exec_host=l["host"], topo=topo, st=st, queue_ms=queue_ms)
    faults.setdefault(name, {})["rate"] = mbit or None


def set_loss(topo, name, pct, faults):
    """Each end of an uplink drops pct% of what it forwards across it, at
    random (nftables numgen: the routers' kernel may have no netem); 0: none."""
    l = find_link(topo, name)
    if l["kind"] != "uplink":
        die("loss: %s is not a leaf-spine link (uplinks only)" % name)
    for ns, ifname in ((topo.ns(l["leaf"]), l["leaf_if"]), (topo.ns(l["spine"]), l["spine_if"])):
        chain = "loss_" + re.sub(r"[^A-Za-z0-9]", "_", ifname)
        for op in ("flush", "delete"):  # (none yet: nothing to say)
            sh(["ip", "netns", "exec", ns, "nft", op, "chain", "inet", "shunt_fabric", chain],
               check=False, quiet=True)
        if pct:
            nsexec(ns, "nft", "add", "chain", "inet", "shunt_fabric", chain,
                   "{ type filter hook forward priority -5; }")
            nsexec(ns, "nft", "add", "rule", "inet", "shunt_fabric", chain, "oifname", '"%s"' % ifname,
                   "numgen", "random", "mod", "100000", "<", str(int(round(pct * 1000))), "drop")
    faults.setdefault(name, {})["loss"] = pct or None


def port_set(topo, st, host, nic, up):
    if host not in topo.hosts or not re.match(r"r\d+$", nic) or int(nic[1:]) >= topo.rails:
        die("no port %s %s" % (host, nic))
    if topo.cfg["kind"] == "vm":
        err = monitor(st, host, "set_link nic-%s %s" % (nic, "on" if up else "off"))
        if err:
            raise FabricError("set_link: " + err)
    else:
        leaf = topo.leaf_of(host, int(nic[1:]))
        ip(topo.ns(leaf), "link", "set", host, "up" if up else "down")
        if up:
            leaf_port_up(topo, host, int(nic[1:]))


def cmd_fault(a):
    st = State(a.name)
    topo = st.load()
    lockfd = st.lock()
    faults = st.faults()
    try:
        if a.fault in ("link-down", "link-up"):
            up = a.fault == "link-up"
            link_set(topo, a.link, up)
            faults.setdefault(a.link, {})["down"] = not up
        elif a.fault == "flap":
            os.close(lockfd)
            lockfd = None
            half = a.period / 2000.0
            for _ in range(a.count):
                link_set(topo, a.link, False)
                time.sleep(half)
                link_set(topo, a.link, True)
                time.sleep(half)
            lockfd = st.lock()
            faults = st.faults()
            faults.setdefault(a.link, {})["down"] = False
        elif a.fault in ("blackhole", "unblackhole"):
            on = a.fault == "blackhole" and not a.off
            blackhole(topo, a.link, on)
            faults.setdefault(a.link, {})["blackhole"] = on
        elif a.fault == "rate":
            if not 0 <= a.mbit <= 100000:
                die("rate: %g Mbit/s is outside 0 (no limit) to 100000" % a.mbit)
            set_rate(topo, st, a.link, a.mbit, faults, a.queue_ms)
        elif a.fault == "loss":
            if not 0 <= a.pct <= 100:
                die("loss: %g%% is outside 0 (none) to 100" % a.pct)
            set_loss(topo, a.link, a.pct, faults)
        elif a.fault in ("port-down", "port-up"):
            up = a.fault == "port-up"
            port_set(topo, st, a.host, a.nic, up)
            faults.setdefault("%s-%s" % (a.host, a.nic), {})["port_down"] = not up
        elif a.fault == "nic-remove":
            # The NIC falls off the bus (PCI remove of its function): the
            # netdev goes, and the rxe device on it with its users' QPs.
            if topo.cfg["kind"] != "vm":
                die("nic-remove needs --kind vm hosts")
            if a.host not in topo.hosts or not re.match(r"r\d+$", a.nic) or int(a.nic[1:]) >= topo.rails:
                die("no NIC %s %s" % (a.host, a.nic))
            # The write returns only once the kernel has let go of the
            # device, and rxe's users hold it until they close it (it has
            # no disassociate): here the job goes on over its other NIC.
            # So the write runs in the background and the fault is done
            # once the netdev is gone (then its port is down).
            script = ('d=$(readlink -f /sys/class/net/%(n)s/device) && [ -e "$d/../remove" ] || { echo "%(n)s has no PCI function to remove (already removed?)" >&2; exit 2; }\n'
                      '(echo 1 > "$d/../remove") </dev/null >/dev/null 2>&1 &\n'
                      'for i in $(seq 300); do [ -e /sys/class/net/%(n)s ] || exit 0; sleep 0.1; done\n'
                      'echo "%(n)s still there after 30 s" >&2; exit 1\n') % {"n": a.nic}
            rc, out, err = exec_capture(topo, st, a.host, ["sh", "-c", script], timeout=45)
            if rc != 0:
                raise FabricError("nic-remove %s %s: %s" % (a.host, a.nic, (out + err).strip() or "exit %d" % rc))
            faults.setdefault("%s-%s" % (a.host, a.nic), {})["removed"] = True
        elif a.fault in ("rdma-remove", "rdma-add"):
            if topo.cfg["kind"] != "vm":
                die("%s needs --kind vm hosts" % a.fault)
            if a.fault == "rdma-remove":
                argv = ["rdma", "link", "delete", a.dev]
            else:
                nic = a.nic or "r" + re.sub(r"\D", "", a.dev)
                argv = ["rdma", "link", "add", a.dev, "type", "rxe", "netdev", nic]
            rc, out, err = exec_capture(topo, st, a.host, argv, timeout=30)
            if rc != 0:
                raise FabricError("%s: %s" % (" ".join(argv), (out + err).strip()))
        st.save_faults(faults)
    except FabricError as e:
        die(str(e))
    finally:
        if lockfd is not None:
            os.close(lockfd)
