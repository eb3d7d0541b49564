#!/usr/bin/env bash
# Every manual page is lint-clean, the ENVIRONMENT list of libshunt(7) is
# exactly the registry's variables, and docs/configuration.md's table is the registry's.
# timeout: 30
. "$(dirname "$0")/../lib.sh"
command -v mandoc >/dev/null || fail "mandoc missing (make deps installs it)"
pages=$(ls "$ROOT"/man/*.[1-9] "$B"/man/*.[1-9] 2>/dev/null)
[ -n "$pages" ] || fail "no manual pages"
for p in $pages; do
  out=$(mandoc -T lint -W warning "$p" 2>&1) || fail "mandoc: $out"
  [ -z "$out" ] || fail "mandoc: $out"
done
ok "$(echo "$pages" | wc -l) pages lint-clean"
"$B/bin/shuntctl" config --json | python3 -c 'import json,sys; print("\n".join(sorted(v["name"] for v in json.load(sys.stdin)["variables"])))' > "$TMP/registry"
sed -n '/^\.Sh ENVIRONMENT/,/^\.Sh /p' "$B/man/libshunt.7" | awk '$1 == ".It" && $2 == "Ev" { print $3 }' | sort > "$TMP/man"
diff -u "$TMP/registry" "$TMP/man" || fail "libshunt.7 ENVIRONMENT differs from the registry"
ok "libshunt.7 lists the $(wc -l < "$TMP/registry") registry variables"
# Each variable's longer text (params_long.def) reaches the man page.
python3 - "$ROOT/core/params_long.def" "$B/man/libshunt.7" <<'PY' || fail "libshunt.7 lacks a variable's longer text from params_long.def"
import re, sys
texts = re.findall(r'SHUNT_PARAM_LONG\(\w+,\s*"((?:[^"\\]|\\.)*)"\)', open(sys.argv[1]).read())
man = open(sys.argv[2]).read().replace("\\-", "-").replace("\\e", "\\").replace("\n", " ")
missing = [t for t in texts if t not in man]
for t in missing: print("missing:", t[:80])
sys.exit(1 if missing or not texts else 0)
PY
ok "libshunt.7 carries the longer text of every variable that has one"
"$B/bin/shuntctl" config --markdown > "$TMP/table"
python3 - "$ROOT/docs/configuration.md" "$TMP/table" <<'PY' || fail "docs/configuration.md's table differs from shuntctl config --markdown"
import sys
doc = open(sys.argv[1]).read()
table = open(sys.argv[2]).read()
sys.exit(0 if table in doc else 1)
PY
ok "docs/configuration.md table matches the registry"
