#!/usr/bin/env bash
# `make install PREFIX=...` alone is enough to run the tools: from another
# directory, without SHUNT_ROOT or BUILD, the installed shunt-run preloads
# the prefix's libshunt, `shunt-bench scenario` finds the prefix's libshunt
# and shunt-fabric, and shunt-fabric finds its guest files in the prefix.
# timeout: 120
. "$(dirname "$0")/../lib.sh"
P=$TMP/prefix
# BUILD as the other makes name it (relative to the tree): an object made
# under another name writes its header dependencies under that name, and
# the next plain `make` no longer sees them
make -s -C "$ROOT" BUILD="${B#"$ROOT"/}" PREFIX="$P" install >"$TMP/install.log" 2>&1 || { cat "$TMP/install.log"; fail "make install"; }
cd "$TMP"
unset SHUNT_ROOT BUILD SRC_ROOT SHUNT_BENCH
for t in shunt-run shunt-bench shunt-bench-scenario shunt-bench-scenario-report shunt-fabric shuntctl shunt-probe shunt-peer; do
  [ -x "$P/bin/$t" ] || fail "$t not installed"
done
for t in shunt-run shunt-bench shunt-fabric shuntctl shunt-probe shunt-peer; do
  [ -f "$P/share/man/man1/$t.1" ] || fail "man page of $t not installed"
done

expect_eq "$("$P/bin/shunt-run" --print-lib)" "$P/lib/shunt/libshunt.so" "shunt-run --print-lib"
"$P/bin/shunt-bench" scenario --help >"$TMP/sc" 2>&1 || { cat "$TMP/sc"; fail "shunt-bench scenario --help exited $?"; }
grep -q '^Usage: shunt-bench scenario NAME' "$TMP/sc" || { cat "$TMP/sc"; fail "scenario usage not printed"; }
uses=$(grep '^Uses: ' "$TMP/sc")
[[ $uses == *"$P/bin/shunt-fabric"* && $uses == *"$P/bin/../lib/shunt/libshunt.so"* ]] ||
  fail "scenario does not use the prefix's tools: $uses"
[[ $uses != *"$ROOT"* ]] || fail "scenario uses the checkout: $uses"
"$P/bin/shunt-fabric" --help >"$TMP/fab" 2>&1 || { cat "$TMP/fab"; fail "shunt-fabric --help exited $?"; }
grep -q 'usage: shunt-fabric' "$TMP/fab" || fail "shunt-fabric usage not printed"
# Where the installed shunt-fabric looks for its package and the guest's
# files (it boots guests only as root, so the paths it settles on at load
# are read instead).
python3 - "$P/bin/shunt-fabric" "$P" "$ROOT" <<'PY' || fail "shunt-fabric looks outside the prefix for its package or guest"
import runpy, sys
fab, prefix, checkout = sys.argv[1:]
g = runpy.run_path(fab, run_name="installed")["paths"]
assert g.__file__.startswith(prefix + "/share/shunt/tools/shunt_fabric/"), g.__file__
assert g.GUEST_SRC == prefix + "/share/shunt/tools/guest", g.GUEST_SRC
assert not g.GUEST_OUT.startswith(checkout), g.GUEST_OUT
assert g.VERSION == open(checkout + "/VERSION").read().strip(), g.VERSION
PY
for f in agent init build-guest; do [ -x "$P/share/shunt/tools/guest/$f" ] || fail "guest $f not installed"; done
[ -f "$P/share/shunt/tools/shunt_fabric/__init__.py" ] || fail "shunt-fabric's package not installed"
ok "installed tools run from $P alone"
