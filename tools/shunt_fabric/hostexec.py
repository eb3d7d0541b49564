"""Running commands on a fabric's hosts: in a host's namespace, or on a
guest through its mux (exec_stream, exec_capture), and the exec command."""
import base64
import json
import os
import socket
import subprocess
import sys

from .common import FabricError, die
from .state import State


def exec_stream(topo, st, host, argv, env=None, cwd=None, out=None, timeout=None):
    """Runs argv on a guest through its mux; returns the exit status.
    out(fd, bytes) receives output (default: our own stdout/stderr)."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(timeout)
    try:
        s.connect(st.path(host + ".exec"))
    except OSError as e:
        raise FabricError("cannot reach %s's agent: %s" % (host, e))
    req = {"op": "exec", "argv": argv, "env": env or {}, "cwd": cwd or "/"}
    s.sendall((json.dumps(req) + "\n").encode())
    f = s.makefile("rb")
    try:
        for line in f:
            m = json.loads(line)
            if "data" in m:
                data = base64.b64decode(m["data"])
                if out:
                    out(m["fd"], data)
                else:
                    fd = 1 if m["fd"] == 1 else 2
                    while data:
                        data = data[os.write(fd, data):]
            elif "exit" in m:
                return m["exit"]
    except socket.timeout:
        raise FabricError("%s: no answer in %ss" % (host, timeout))
    raise FabricError("%s: agent connection lost" % host)


def exec_capture(topo, st, host, argv, timeout=None):
    if topo.cfg["kind"] == "ns":
        r = subprocess.run(["ip", "netns", "exec", topo.ns(host)] + argv, text=True,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=timeout)
        return r.returncode, r.stdout, r.stderr
    bufs = {1: b"", 2: b""}

    def out(fd, data):
        bufs[fd] += data
    rc = exec_stream(topo, st, host, argv, out=out, timeout=timeout)
    return rc, bufs[1].decode(errors="replace"), bufs[2].decode(errors="replace")


def cmd_exec(a):
    st = State(a.name)
    topo = st.load()
    if a.host not in topo.hosts:
        die("no host %s (hosts: %s)" % (a.host, " ".join(topo.hosts)))
    argv = a.argv[1:] if a.argv[:1] == ["--"] else a.argv
    if not argv:
        die("exec: no command")
    env = {}
    for e in a.env or []:
        k, eq, v = e.partition("=")
        env[k] = v if eq else os.environ.get(k, "")
    cwd = a.cwd or os.getcwd()
    if topo.cfg["kind"] == "ns":
        os.environ.update(env)
        os.chdir(cwd)
        os.execvp("ip", ["ip", "netns", "exec", topo.ns(a.host)] + argv)
    try:
        sys.exit(exec_stream(topo, st, a.host, argv, env=env, cwd=cwd))
    except FabricError as e:
        die(str(e), 255)
