"""Where shunt-fabric's files are: the state root (STATE_ROOT), the entry
point (ME), the project tree holding the guest's files (ROOT, GUEST_SRC),
where the guest kernel is built (GUEST_OUT) and the version (VERSION).

All but STATE_ROOT follow from the entry point's path: it calls locate()
before anything runs, and the other modules read them as paths.NAME.
"""
import os

STATE_ROOT = os.environ.get("SHUNT_FABRIC_STATE", "/run/shunt-fabric")
ME = ROOT = INSTALLED = GUEST_SRC = GUEST_OUT = VERSION = None


def project_root():
    """The tree holding tools/guest: the checkout around the entry point
    ME (tools/ or build/bin/), or PREFIX/share/shunt where installed."""
    if os.environ.get("SHUNT_ROOT"):
        return os.environ["SHUNT_ROOT"]
    d = os.path.dirname(ME)
    for cand in (os.path.join(d, ".."), os.path.join(d, "..", ".."), os.path.join(d, "..", "share", "shunt")):
        if os.path.isfile(os.path.join(cand, "tools", "guest", "agent")):
            return os.path.realpath(cand)
    return os.path.realpath(os.path.join(d, ".."))


def locate(me, version):
    """Sets the paths from ME, the entry point's real path, and the version
    that `make` wrote into it (VERSION is read from ROOT where it did not)."""
    global ME, ROOT, INSTALLED, GUEST_SRC, GUEST_OUT, VERSION
    ME = me
    ROOT = project_root()
    INSTALLED = not os.path.isfile(os.path.join(ROOT, "Makefile"))
    GUEST_SRC = os.path.join(ROOT, "tools", "guest")
    # Installed, the guest kernel and initramfs are built into the user's cache
    # (the prefix may be read-only); in a checkout, into build/guest.
    GUEST_OUT = os.environ.get("SHUNT_FABRIC_GUEST", os.path.join(
        os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "shunt-fabric", "guest") if INSTALLED
        else os.path.join(ROOT, "build", "guest"))
    # `make` writes the version into the entry point; a script run from the
    # checkout reads VERSION.
    VERSION = version
    if VERSION.startswith("@"):
        try:
            VERSION = open(os.path.join(ROOT, "VERSION")).read().strip()
        except OSError:
            VERSION = "unknown"
