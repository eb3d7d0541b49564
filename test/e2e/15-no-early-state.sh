#!/usr/bin/env bash
# Nothing of libshunt's state needs code to be built when the library
# loads: its wrappers can run before its own static initializers have (a
# socket opened in another library's constructor, e2e 15-ctor-socket), and
# so can the threads they start (the agent), which then met a map that did
# not exist yet. Every dynamic initializer in libshunt.so is disassembled;
# the only thing one may call is shunt::on_fork (fork handlers, which
# nothing but a fork reads). State is built on first use instead.
# timeout: 60
. "$(dirname "$0")/../lib.sh"
[ -f "$LIB" ] || fail "no $LIB (make)"
command -v objdump > /dev/null || skip "no objdump (binutils)"
objdump -d -C --no-show-raw-insn "$LIB" > "$TMP/dis" || fail "objdump $LIB"
python3 - "$TMP/dis" <<'PY' || fail "libshunt builds state at load"
import re, sys
fn, calls, bad, seen = None, {}, [], 0
for line in open(sys.argv[1]):
    m = re.match(r"^[0-9a-f]+ <(.*)>:$", line)
    if m:
        fn = m.group(1) if m.group(1).startswith("_GLOBAL__sub_I_") else None
        seen += fn is not None
        continue
    if fn:
        c = re.search(r"\s(call|jmp)\s+[0-9a-f]+ <([^>]*)>", line)
        if c and not c.group(2).startswith(fn):
            calls.setdefault(fn, set()).add(c.group(2))
for fn, targets in sorted(calls.items()):
    for t in sorted(targets):
        if not t.startswith("shunt::on_fork("):
            bad.append("%s calls %s" % (fn, t))
print("%d dynamic initializers, each calls: %s" % (seen, sorted({t for ts in calls.values() for t in ts})))
if bad:
    sys.exit("built at load (a wrapper or a thread may run first):\n" + "\n".join(bad))
PY
echo ok
