"""What every part of shunt-fabric uses: its error (FabricError), dying
with a message (die) and running a command (sh)."""
import subprocess
import sys


class FabricError(Exception):
    pass


def die(msg, code=1):
    sys.stderr.write("shunt-fabric: %s\n" % msg)
    sys.exit(code)


def sh(argv, check=True, quiet=False, input=None):
    r = subprocess.run(argv, input=input, text=True, stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE)
    if check and r.returncode != 0:
        raise FabricError("%s: %s" % (" ".join(argv), r.stderr.strip() or r.returncode))
    if not quiet and r.returncode != 0:
        sys.stderr.write("shunt-fabric: warning: %s: %s\n" % (" ".join(argv), r.stderr.strip()))
    return r
