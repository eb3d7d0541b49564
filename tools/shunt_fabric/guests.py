"""The qemu guests: their command line, booting them behind their leaves
(with a mux each), waiting for their RDMA ports, and qemu's monitor."""
import os
import socket
import subprocess
import sys
import threading
import time

from . import paths
from .common import FabricError, sh
from .hostexec import exec_capture
from .network import HOST_SYSCTLS, ip, leaf_port_up, make_ns


def qemu_argv(topo, st, host):
    cfg = topo.cfg
    # A guest has one CPU, and rxe runs a QP's send loop inside the
    # application's ibv_post_send. Under the kernel's default voluntary
    # preemption that loop kept the CPU while the softirqs deferred to
    # ksoftirqd (the NIC's receive and transmit completions, so the ARP reply
    # its packets waited for) never ran: "soft lockup ... [ib_write_bw]" in
    # rxe_post_send -> rxe_requester -> neigh_resolve_output, then the NIC's
    # transmit queue timing out, and a process stuck in rxe_cleanup at exit.
    # preempt=full lets ksoftirqd run; the neighbours on both sides of every
    # tap are permanent, so a packet never waits for ARP. loglevel=5 puts a
    # lockup's stack trace in the console log.
    nics, append = [], ["console=ttyS0", "panic=-1", "loglevel=5", "preempt=full",
                        "shunt.dir=" + paths.GUEST_SRC, "shunt.host=" + host, "shunt.repo=" + paths.ROOT]
    for r in range(topo.rails):
        nic = "r%d" % r
        nics += ["-netdev", "tap,id=%s,ifname=%s%s,script=no,downscript=no" % (nic, host, nic),
                 "-device", "virtio-net-pci,netdev=%s,mac=%s,id=nic-%s" % (nic, topo.mac(host, r), nic)]
        append.append("shunt.nic=%s,%s,%s/24,%s,10.%d.0.0/16,rxe%d,%s" % (
            nic, topo.mac(host, r), topo.host_addr(host, r), topo.port_addr(host, r), r, r,
            topo.port_mac(host, r)))
    fs = "security_model=none,readonly=on,multidevs=remap"
    # The uncompressed image when build-guest could make one (PVH entry).
    kernel = os.path.join(paths.GUEST_OUT, "vmlinux")
    if not os.path.exists(kernel):
        kernel = os.path.join(paths.GUEST_OUT, "vmlinuz")
    return ["qemu-system-x86_64", "-accel", "tcg", "-name", "sf-%s-%s" % (topo.name, host),
            "-m", str(cfg["mem"]), "-smp", str(cfg["cpus"]), "-display", "none", "-no-reboot",
            "-kernel", kernel,
            "-initrd", os.path.join(paths.GUEST_OUT, "initrd.img"),
            "-append", " ".join(append),
            "-virtfs", "local,path=/,mount_tag=hostroot," + fs,
            "-virtfs", "local,path=%s,mount_tag=guestmods,%s" % (os.path.join(paths.GUEST_OUT, "modules"), fs),
            # The project tree again, mounted at its own path after the
            # guest's tmpfs: a checkout under /tmp or /root stays visible.
            "-virtfs", "local,path=%s,mount_tag=repo,%s" % (paths.ROOT, fs),
            ] + nics + [
            # Entropy from the host: the guest's random pool is ready at
            # once, not seconds into the boot, for whatever reads it first.
            "-device", "virtio-rng-pci",
            "-device", "virtio-serial-pci",
            "-chardev", "socket,id=agent,path=%s,server=on,wait=off" % st.path(host + ".agent"),
            "-device", "virtserialport,chardev=agent,name=shunt.agent",
            "-monitor", "unix:%s,server=on,wait=off" % st.path(host + ".monitor"),
            "-serial", "file:" + st.path(host + ".console"),
            "-pidfile", st.path(host + ".qemu.pid"), "-daemonize"]


def build_vm_hosts(topo, st):
    # build-guest returns at once when the kernel and init are current, and
    # rebuilds the initramfs when tools/guest/init changed.
    sh([os.path.join(paths.GUEST_SRC, "build-guest"), paths.GUEST_OUT])
    for h in topo.hosts:
        hns = make_ns(topo, h, HOST_SYSCTLS)
        sh(["ip", "netns", "exec", hns] + qemu_argv(topo, st, h))
        with open(st.path(h + ".qemu.pid")) as f:
            st.record_pid("qemu:" + h, int(f.read().strip()))
        # qemu made the taps in the host's namespace; each becomes a routed
        # port of its rail's leaf (the open tap fd survives the move).
        for r in range(topo.rails):
            leaf = topo.leaf_of(h, r)
            tap = "%sr%d" % (h, r)
            ip(hns, "link", "set", tap, "netns", topo.ns(leaf))
            ip(topo.ns(leaf), "link", "set", tap, "name", h)
            ip(topo.ns(leaf), "link", "set", h, "address", topo.port_mac(h, r))
            leaf_port_up(topo, h, r)
        mux = subprocess.Popen([sys.executable, paths.ME, "_mux", "--name", topo.name, h],
                               stdin=subprocess.DEVNULL, stdout=open(st.path(h + ".mux.log"), "w"),
                               stderr=subprocess.STDOUT, start_new_session=True)
        st.record_pid("mux:" + h, mux.pid)


def wait_guests(topo, st, timeout):
    """Waits for every guest's rxe ports, all guests at once: the mux holds
    a command until its agent is ready, so each host's first check answers
    as soon as that guest has booted."""
    deadline = time.time() + timeout
    pending = set(topo.hosts)
    lock = threading.Lock()

    def wait_one(h):
        while time.time() < deadline:
            try:
                rc, out, _ = exec_capture(topo, st, h, ["rdma", "link"],
                                          timeout=max(1, deadline - time.time()))
            except (OSError, FabricError):
                rc, out = -1, ""
            if rc == 0 and out.count("ACTIVE") >= topo.rails:
                with lock:
                    pending.discard(h)
                return
            time.sleep(0.2)
    threads = [threading.Thread(target=wait_one, args=(h,), daemon=True) for h in topo.hosts]
    for t in threads:
        t.start()
    for t in threads:
        t.join(max(0, deadline - time.time()) + 1)
    if pending:
        raise FabricError("guests not ready after %ds: %s (see %s/*.console)" % (
            timeout, " ".join(sorted(pending)), st.dir))


def monitor(st, host, command):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(10)
    s.connect(st.path(host + ".monitor"))
    buf = b""
    while not buf.endswith(b"(qemu) "):
        buf += s.recv(4096)
    s.sendall(command.encode() + b"\n")
    buf = b""
    while not buf.endswith(b"(qemu) "):
        chunk = s.recv(4096)
        if not chunk:
            break
        buf += chunk
    s.close()
    text = buf.decode(errors="replace").replace("(qemu) ", "")
    lines = [l for l in text.replace("\r", "").split("\n") if l.strip() and command not in l]
    return "\n".join(lines).strip()
