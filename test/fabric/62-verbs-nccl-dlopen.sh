#!/usr/bin/env bash
# timeout: 420
# A program that loads verbs by name as NCCL 2.21-2.29 do
# (examples/verbs_nccl_dlopen) reaches shunt on soft-RoCE devices under the
# preload in active mode: the 16 entry points libshunt wraps come from it,
# every device is opened and every QP made through it (across a dlclose and
# a second load), and the program prints what it prints without shunt;
# two ranks of it (--pair: WRITE + WRITE_WITH_IMM, every byte checked) ride
# out a 10 s black hole on a spine link through a bundle with #wrong 0.
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

# The same loading, two ranks: WRITE + WRITE_WITH_IMM h1 -> h2 on rxe0
# through a bundle (active mode, one job key) while the link from h1's
# rail-0 leaf to spine s1 drops everything for 10 s: both ends finish with
# no error and every byte right. The TCP setup rides rail 1.
gid=$(fab gid h1 rxe0) || fail "no IPv4 GID"
srv_addr=$(fab addr h2 r1)
port=$((29500 + RANDOM % 200))
pair() {  # pair HOST NAME server|ADDR
  fab exec "$1" -- timeout 120 env LD_PRELOAD="$LIB" SHUNT_MODE=active SHUNT_JOB_KEY=nccl-dlopen-$$ \
    SHUNT_LOG_LEVEL=info SHUNT_STATS_FILE="/tmp/$2.json" "$prog" --pair rxe0 "$gid" "$3" "$port" 30
}
note "pair, 30 s, l1r0-s1 black-holed 10 s from the 8th"
pair h2 pair-srv server > "$TMP/pair-srv.out" 2>&1 &
srv=$!
pair h1 pair-cli "$srv_addr" > "$TMP/pair-cli.out" 2>&1 &
cli=$!
sleep 8
fab fault blackhole l1r0-s1 > /dev/null || fail "blackhole"
sleep 10
fab fault unblackhole l1r0-s1 > /dev/null || fail "unblackhole"
wait $cli; cli_rc=$?
wait $srv; srv_rc=$?
[ $cli_rc = 0 ] && [ $srv_rc = 0 ] || {
  cat "$TMP/pair-cli.out" "$TMP/pair-srv.out"
  fail "the pair did not survive (client exit $cli_rc, server exit $srv_rc)"
}
grep -q "bundle active" "$TMP/pair-cli.out" || { cat "$TMP/pair-cli.out"; fail "no bundle on the client"; }
for side in cli srv; do
  line=$(grep -E '^(client|server): [0-9]+ iterations, #wrong' "$TMP/pair-$side.out") ||
    fail "no result from the $side: $(cat "$TMP/pair-$side.out")"
  [[ $line == *"#wrong 0" ]] || fail "$side: $line"
  echo "ok: $line"
done
