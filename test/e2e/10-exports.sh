#!/usr/bin/env bash
# libshunt.so exports exactly the wrapped entry points, each under the
# version node of the real library's default version, and nothing else.
# timeout: 30
. "$(dirname "$0")/../lib.sh"
[ -f "$LIB" ] || fail "no $LIB"
nm -D --defined-only "$LIB" | awk '$2 != "A" { print $3 }' | sort > "$TMP/all"
# The one non-default version: dlopen at glibc's first version, for callers
# built against glibc before 2.34 (x86_64: GLIBC_2.2.5, aarch64: GLIBC_2.17).
grep -v '@@' "$TMP/all" > "$TMP/compat"
grep '@@' "$TMP/all" > "$TMP/exported"
case $(uname -m) in
  x86_64) expect_eq "$(cat "$TMP/compat")" dlopen@GLIBC_2.2.5 "compat exports" ;;
  aarch64) expect_eq "$(cat "$TMP/compat")" dlopen@GLIBC_2.17 "compat exports" ;;
esac
# Anything defined but not a plain T (e.g. unique 'u' symbols of inline
# statics, data 'D'/'B') would escape the version script: none allowed.
nm -D --defined-only "$LIB" | awk '$2 != "A" && $2 != "T" { print }' > "$TMP/odd"
[ -s "$TMP/odd" ] && fail "unexpected exported symbols: $(cat "$TMP/odd")"
awk '/^[A-Z]/ { v = $1 } /^    [a-z_]/ { gsub(/[ ;]/, ""); print $0 "@@" v }' "$B/shunt.map" | sort |
  grep -vxF -f <(sed 's/@/@@/' "$TMP/compat") > "$TMP/allowed"
diff -u "$TMP/allowed" "$TMP/exported" || fail "exports differ from the version map"
expect_eq "$(wc -l < "$TMP/exported")" "$(grep -c '^[a-z_]' "$ROOT/interpose/exports.list")" "exported symbols"
grep -q '^ibv_open_device@@IBVERBS_1.1$' "$TMP/exported" || fail "ibv_open_device not under IBVERBS_1.1"
grep -q '^ibv_reg_mr_iova2@@IBVERBS_1.8$' "$TMP/exported" || fail "ibv_reg_mr_iova2 not under IBVERBS_1.8"
grep -q '^socket@@GLIBC_2.2.5$' "$TMP/exported" || fail "socket not under GLIBC_2.2.5"
grep -q '^dlopen@@GLIBC_2.34$' "$TMP/exported" || fail "dlopen not under GLIBC_2.34"
readelf -d "$LIB" | grep -q 'NEEDED.*libibverbs' || fail "libshunt.so does not link libibverbs"
ok "exports match"
