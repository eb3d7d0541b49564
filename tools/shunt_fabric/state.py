"""A fabric's state files under STATE_ROOT/NAME/: its topology (topo.json),
the faults in force (faults.json), the pids it started, and its lock."""
import fcntl
import json
import os
import re

from .common import die
from .paths import STATE_ROOT
from .topology import Topo


class State:
    def __init__(self, name):
        if not re.match(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,15}$", name):
            die("bad fabric name %r (letters, digits, - and _, at most 16)" % name)
        self.name = name
        self.dir = os.path.join(STATE_ROOT, name)

    def path(self, *p):
        return os.path.join(self.dir, *p)

    def exists(self):
        return os.path.isfile(self.path("topo.json"))

    def load(self):
        if not self.exists():
            die("fabric %r is not up (no %s)" % (self.name, self.path("topo.json")))
        with open(self.path("topo.json")) as f:
            return Topo(json.load(f))

    def lock(self):
        os.makedirs(self.dir, exist_ok=True)
        fd = os.open(self.path("lock"), os.O_RDWR | os.O_CREAT, 0o644)
        fcntl.flock(fd, fcntl.LOCK_EX)
        return fd

    def faults(self):
        try:
            with open(self.path("faults.json")) as f:
                return json.load(f)
        except (OSError, ValueError):
            return {}

    def save_faults(self, faults):
        tmp = self.path("faults.json.tmp")
        with open(tmp, "w") as f:
            json.dump(faults, f, indent=1, sort_keys=True)
        os.replace(tmp, self.path("faults.json"))

    def record_pid(self, what, pid):
        with open(self.path("pids"), "a") as f:
            f.write("%s %d\n" % (what, pid))

    def pids(self):
        try:
            with open(self.path("pids")) as f:
                return [(l.split()[0], int(l.split()[1])) for l in f if l.strip()]
        except OSError:
            return []
