"""Bringing a fabric up (cmd_up) and taking it down again (teardown,
cmd_down): its namespaces, the processes it started and its state."""
import json
import os
import shutil
import signal
import sys
import time

from .common import FabricError, die, sh
from .faults import set_rate
from .guests import build_vm_hosts, wait_guests
from .network import build_ns_hosts, build_routers, leaf_routes, spine_routes
from .paths import STATE_ROOT
from .state import State
from .topology import Topo


def cmd_up(a):
    st = State(a.name)
    if st.exists() or any(n.startswith("sf-%s-" % a.name) for n in list_netns()):
        die("fabric %r is already up (shunt-fabric down --name %s)" % (a.name, a.name))
    if a.kind == "vm" and not os.path.exists("/dev/net/tun"):
        die("no /dev/net/tun")
    cfg = {"name": a.name, "hosts": a.hosts, "rails": a.rails, "spines": a.spines,
           "hosts_per_leaf": a.hosts_per_leaf, "kind": a.kind, "mem": a.mem, "cpus": a.cpus,
           "rate": a.rate, "ecmp_hash": a.ecmp_hash, "created": time.time()}
    if not (1 <= a.hosts <= 254 and 1 <= a.rails <= 16 and 1 <= a.spines <= 63):
        die("hosts 1..254, rails 1..16, spines 1..63")
    topo = Topo(cfg)
    if topo.racks * topo.rails > 256:
        die("too many leaves (racks x rails > 256)")
    os.makedirs(st.dir, exist_ok=True)
    with open(st.path("topo.json"), "w") as f:
        json.dump(cfg, f, indent=1)
    t0 = time.time()
    try:
        build_routers(topo)
        if a.kind == "ns":
            build_ns_hosts(topo)
        else:
            build_vm_hosts(topo, st)
        for leaf in topo.leaves:
            leaf_routes(topo, leaf)
        for s in topo.spines:
            spine_routes(topo, s)
        if a.kind == "vm":
            wait_guests(topo, st, a.boot_timeout)
        if a.rate:
            faults = {}
            for link in topo.links():
                set_rate(topo, st, link, a.rate, faults)
            st.save_faults(faults)
    except (FabricError, OSError) as e:
        sys.stderr.write("shunt-fabric: up failed: %s\n" % e)
        teardown(a.name)
        sys.exit(1)
    print("fabric %s up: %d hosts (%s), %d rails, %d spines, %.1fs" % (
        a.name, a.hosts, a.kind, a.rails, a.spines, time.time() - t0))


def list_netns():
    r = sh(["ip", "netns", "list"], check=False, quiet=True)
    return [l.split()[0] for l in r.stdout.splitlines() if l.strip()]


def pid_is(pid, word):
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as f:
            return word.encode() in f.read()
    except OSError:
        return False


def teardown(name):
    st = State(name)
    tag = "sf-%s-" % name
    def ours(what, pid):
        # a recorded pid counts only while it still runs our command line
        return pid_is(pid, tag) if what.startswith("qemu") else (
            pid_is(pid, "_mux") and pid_is(pid, name))
    victims = [(w, p) for w, p in st.pids() if ours(w, p)]
    for _, p in victims:
        try:
            os.kill(p, signal.SIGTERM)
        except OSError:
            pass
    deadline = time.time() + 5
    for w, p in victims:
        while os.path.exists("/proc/%d" % p) and time.time() < deadline:
            time.sleep(0.05)
        if os.path.exists("/proc/%d" % p) and ours(w, p):
            try:
                os.kill(p, signal.SIGKILL)
            except OSError:
                pass
    for ns in list_netns():
        if ns.startswith(tag):
            sh(["ip", "netns", "del", ns], check=False)
    shutil.rmtree(st.dir, ignore_errors=True)


def cmd_down(a):
    names = [a.name]
    if a.all:
        names = sorted(set(os.listdir(STATE_ROOT) if os.path.isdir(STATE_ROOT) else []) |
                       {n.split("-")[1] for n in list_netns() if n.startswith("sf-")})
    for n in names:
        teardown(n)
