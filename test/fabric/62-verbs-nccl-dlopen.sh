#!/usr/bin/env bash
# timeout: 300
# A program that loads verbs by name as NCCL 2.21-2.29 do
# (examples/verbs_nccl_dlopen) reaches shunt on soft-RoCE devices under the
# preload in active mode: the 16 entry points libshunt wraps come from it,
# every device is opened and every QP made through it (across a dlclose and
# a second load), and the program prints what it prints without shunt.
. "$(dirname "$0")/lib.sh"
need_guests
[ -f "$LIB" ] || fail "no $LIB (make)"
prog=$B/examples/verbs_nccl_dlopen
[ -x "$prog" ] || fail "no $prog (make)"
up --hosts 2 --rails 2 --spines 2

fab exec h1 -- timeout 60 "$prog" > "$TMP/plain.out" 2>&1 || fail "without shunt: $(cat "$TMP/plain.out")"
ndev=$(awk '/device\(s\) through/ { print $1; exit }' "$TMP/plain.out")
[ "${ndev:-0}" -ge 1 ] || fail "no RDMA device on h1: $(cat "$TMP/plain.out")"
[ "$(grep -c 'qp reached INIT' "$TMP/plain.out")" = $((2 * ndev)) ] || fail "without shunt: $(cat "$TMP/plain.out")"
echo "ok: $ndev device(s), a QP in INIT on each, twice, without shunt"

fab exec h1 -- timeout 60 env LD_PRELOAD="$LIB" SHUNT_MODE=active SHUNT_JOB_KEY=nccl-dlopen-$$ \
  SHUNT_STATS_FILE=/tmp/nccl-dlopen.json "$prog" --where > "$TMP/shunt.out" 2>&1 ||
  fail "under the preload: $(cat "$TMP/shunt.out")"
grep -v '^ibv_' "$TMP/shunt.out" | diff "$TMP/plain.out" - || fail "output changed under the preload"
n=$(awk -v lib="$LIB" '/^ibv_/ && $3 == lib' "$TMP/shunt.out" | wc -l)
[ "$n" = 16 ] || fail "$n of NCCL's symbols from libshunt, expected 16: $(grep '^ibv_' "$TMP/shunt.out")"
echo "ok: 16 of NCCL's symbols from libshunt"
fab exec h1 -- cat /tmp/nccl-dlopen.json > "$TMP/stats.json" || fail "no stats file on h1"
for call in ibv_get_device_list:2 ibv_open_device:$((2 * ndev)) ibv_create_qp:$((2 * ndev)) ibv_modify_qp:$((2 * ndev)); do
  got=$(jget "$TMP/stats.json" "d['verbs']['calls'].get('${call%%:*}', 0)")
  [ "$got" = "${call##*:}" ] || fail "${call%%:*} calls seen by shunt: $got, expected ${call##*:}"
  echo "ok: ${call%%:*} calls seen by shunt = $got"
done
