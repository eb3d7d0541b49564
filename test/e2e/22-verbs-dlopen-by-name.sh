#!/usr/bin/env bash
# Under LD_PRELOAD, a program that loads verbs by name as NCCL 2.21-2.29 do
# (dlopen "libibverbs.so[.1]", dlvsym at IBVERBS_1.x) reaches every wrapper
# libshunt exports at that version, and the real libibverbs for the rest;
# calls through the handle are counted, a closed handle can be opened again.
# The same holds by path, through dlmopen(LM_ID_BASE) and through dlopen at
# glibc's pre-2.34 version. SHUNT_MODE=off, other libraries (found through
# the caller's own RUNPATH) and a program that opens libshunt itself are
# left as they are.
# timeout: 60
. "$(dirname "$0")/../lib.sh"
prog=$B/examples/verbs_nccl_dlopen
where=$B/test/dlopen_where
[ -x "$prog" ] && [ -x "$where" ] || fail "build $prog and $where first"
shunt=$(realpath "$LIB")
verbs=$(realpath "$(ldconfig -p | awk '$1 == "libibverbs.so.1" { print $NF; exit }')")
[ -f "$verbs" ] || skip "no libibverbs.so.1"

# name@version of every wrapper libshunt exports
nm -D --defined-only "$LIB" | awk '$3 ~ /^ibv_/ { sub("@@", "@", $3); print $3 }' | sort > "$TMP/wrapped"
# check_where FILE WHAT: each "SYMBOL VERSION OBJECT" line of FILE lies in
# libshunt when libshunt wraps SYMBOL@VERSION, else in the real libibverbs
# (lines of dlsym, VERSION "-", are left to the caller);
# sets in_shunt to the number found in libshunt.
check_where() {
  local n=0 sym ver obj want
  in_shunt=0
  while read -r sym ver obj; do
    [[ $sym == ibv_* && $ver != - ]] || continue
    n=$((n + 1))
    if grep -qx "$sym@$ver" "$TMP/wrapped"; then want=$shunt; in_shunt=$((in_shunt + 1)); else want=$verbs; fi
    [ "$(realpath "$obj" 2>/dev/null)" = "$want" ] || fail "$2: $sym@$ver resolved in $obj, expected $want"
  done < "$1"
  [ "$n" -gt 0 ] || fail "$2: no symbol printed"
  ok "$2: $n symbols, $in_shunt of them in libshunt, the rest in libibverbs"
}

all_in_verbs() {  # all_in_verbs FILE WHAT
  while read -r sym ver obj; do
    [ "$(realpath "$obj")" = "$verbs" ] || fail "$2: $sym@$ver in $obj"
  done < <(grep '^ibv_' "$1")
  ok "$2: every symbol in libibverbs"
}
"$prog" --where > "$TMP/plain.out" 2> "$TMP/plain.err"; plain_rc=$?
all_in_verbs "$TMP/plain.out" "without shunt"

SHUNT_MODE=observe SHUNT_STATS_FILE="$TMP/obs-%p.json" LD_PRELOAD=$LIB "$prog" --where > "$TMP/obs.out" 2> "$TMP/obs.err"
expect_eq "$?" "$plain_rc" "exit status under observe"
check_where "$TMP/obs.out" "NCCL 2.2x loading under observe"
# NCCL's list holds 16 names that libshunt wraps at the version NCCL asks for
expect_eq "$in_shunt" 16 "NCCL symbols answered by libshunt"
grep -v '^ibv_' "$TMP/plain.out" > "$TMP/plain.rest"
grep -v '^ibv_' "$TMP/obs.out" | diff "$TMP/plain.rest" - || fail "output changed under observe"
diff "$TMP/plain.err" "$TMP/obs.err" || fail "stderr changed under observe"
f=$(ls "$TMP"/obs-*.json) || fail "no stats file"
# once per load: the second, after dlclose, goes through libshunt too
expect_eq "$(jget "$f" 'd["verbs"]["calls"].get("ibv_get_device_list", 0)')" 2 "ibv_get_device_list calls through dlvsym"

# By the real file's path, through dlmopen in the base namespace, through
# the pre-2.34 dlopen: the same answer.
syms=(ibv_create_qp IBVERBS_1.1 ibv_reg_mr_iova2 IBVERBS_1.8 ibv_query_port IBVERBS_1.1 ibv_get_device_list -)
for how in "$verbs" "--lm libibverbs.so.1" "--base libibverbs.so"; do
  # shellcheck disable=SC2086
  SHUNT_MODE=observe LD_PRELOAD=$LIB "$where" $how "${syms[@]}" > "$TMP/how.out" || fail "open $how failed"
  check_where "$TMP/how.out" "open $how"
  expect_eq "$(awk '$1 == "ibv_get_device_list" { print $3 }' "$TMP/how.out")" "$shunt" "open $how: dlsym without version"
done

# SHUNT_MODE=off: everything from libibverbs, no stats.
SHUNT_MODE=off SHUNT_STATS_FILE="$TMP/off-%p.json" LD_PRELOAD=$LIB "$prog" --where > "$TMP/off.out" 2> "$TMP/off.err"
expect_eq "$?" "$plain_rc" "exit status under off"
all_in_verbs "$TMP/off.out" "SHUNT_MODE=off"
grep -v '^ibv_' "$TMP/off.out" | diff "$TMP/plain.rest" - || fail "output changed under off"
ls "$TMP"/off-*.json 2>/dev/null && fail "off mode wrote a stats file"

# Another library, found only through the caller's RUNPATH ($ORIGIN): the
# real dlopen must still see the caller, by dlopen and by dlmopen.
for how in "" --lm --base; do
  # shellcheck disable=SC2086
  SHUNT_MODE=observe LD_PRELOAD=$LIB "$where" $how ctor_socket_lib.so ctor_fd - > "$TMP/other.out" 2> "$TMP/other.err" ||
    fail "dlopen $how of a library on the caller's RUNPATH failed under the preload: $(cat "$TMP/other.err")"
  expect_eq "$(awk '{ print $3 }' "$TMP/other.out")" "$(realpath "$B/test/ctor_socket_lib.so")" "other library ${how:-by dlopen}"
done

# A program that opens libshunt itself (no preload) still gets libibverbs.
"$where" --first "$LIB" libibverbs.so.1 ibv_create_qp IBVERBS_1.1 > "$TMP/self.out" || fail "open after libshunt failed"
expect_eq "$(awk '{ print $3 }' "$TMP/self.out")" "$verbs" "libibverbs after dlopen of libshunt"

# librdmacm by name, by path, through dlmopen and through the pre-2.34
# dlopen: the rdma_* entry points libshunt wraps (its disconnect over a dead
# route) come from libshunt, every other from the real librdmacm, through
# libshunt-rdmacm.so; the handle closes. Without the preload, under
# SHUNT_MODE=off, and for a libshunt with no libshunt-rdmacm.so beside it
# (said once, at warning level): everything from librdmacm.
rdmacm=$(realpath "$(ldconfig -p | awk '$1 == "librdmacm.so.1" { print $NF; exit }')")
[ -f "$rdmacm" ] || skip "no librdmacm.so.1"
nm -D --defined-only "$LIB" | awk '$3 ~ /^rdma_/ { sub("@@", "@", $3); print $3 }' | sort > "$TMP/wrapped_cm"
expect_eq "$(wc -l < "$TMP/wrapped_cm")" 3 "rdma_* entry points libshunt wraps"
cm_syms=(rdma_disconnect RDMACM_1.0 rdma_get_cm_event RDMACM_1.0 rdma_ack_cm_event RDMACM_1.0
  rdma_create_id RDMACM_1.0 rdma_connect RDMACM_1.0 rdma_destroy_id RDMACM_1.0 rdma_get_cm_event -)
# check_cm FILE WHAT WRAPPED_IN: wrapped names in WRAPPED_IN, the rest in librdmacm
check_cm() {
  local n=0 sym ver obj want
  while read -r sym ver obj; do
    n=$((n + 1))
    if grep -qx "$sym@${ver/-/RDMACM_1.0}" "$TMP/wrapped_cm"; then want=$3; else want=$rdmacm; fi
    [ "$(realpath "$obj" 2>/dev/null)" = "$want" ] || fail "$2: $sym@$ver resolved in $obj, expected $want"
  done < "$1"
  expect_eq "$n" 7 "$2: symbols printed"
  ok "$2: the wrapped rdma_* in $(basename "$3"), the rest in librdmacm"
}
for how in librdmacm.so.1 librdmacm.so "$rdmacm" "--lm librdmacm.so.1" "--base librdmacm.so.1"; do
  # shellcheck disable=SC2086
  SHUNT_MODE=observe LD_PRELOAD=$LIB "$where" $how "${cm_syms[@]}" > "$TMP/cm.out" 2> "$TMP/cm.err" ||
    fail "open $how failed: $(cat "$TMP/cm.err")"
  check_cm "$TMP/cm.out" "rdmacm: open $how" "$shunt"
done
"$where" librdmacm.so.1 "${cm_syms[@]}" > "$TMP/cm.out" || fail "open of librdmacm without shunt failed"
check_cm "$TMP/cm.out" "rdmacm without shunt" "$rdmacm"
SHUNT_MODE=off LD_PRELOAD=$LIB "$where" librdmacm.so.1 "${cm_syms[@]}" > "$TMP/cm.out" || fail "open under off failed"
check_cm "$TMP/cm.out" "rdmacm under SHUNT_MODE=off" "$rdmacm"
mkdir "$TMP/alone" && cp "$LIB" "$TMP/alone/libshunt.so"
SHUNT_MODE=observe LD_PRELOAD=$TMP/alone/libshunt.so "$where" librdmacm.so.1 "${cm_syms[@]}" > "$TMP/cm.out" 2> "$TMP/cm.err" ||
  fail "open without libshunt-rdmacm.so failed"
check_cm "$TMP/cm.out" "rdmacm, libshunt alone" "$rdmacm"
grep -q "warning.*libshunt-rdmacm.so is not beside libshunt" "$TMP/cm.err" || fail "no warning without libshunt-rdmacm.so: $(cat "$TMP/cm.err")"
