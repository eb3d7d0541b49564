#!/usr/bin/env bash
# Verbs bundles against ECMP collisions, on soft-RoCE guests: two leaves,
# two spines, every leaf-spine link limited to RATE Mbit/s (tbf) so the
# spines, not the guests' CPUs, are the bottleneck. Two 2-rank shunt-bench
# all-to-all jobs run at once across the spines, -c 1: both on h1<->h2 as
# separate processes (BUNDLE_BENCH_HOSTS=2, the default: one guest per
# leaf), or h1<->h3 and h2<->h4 (4: two per leaf).
# - without shunt, each job's QP sits on the spine its UDP source port
#   hashes to, each way. The runs are classified by the fabric's counters:
#   "collided" when one of leaf 1's uplinks carried >= 90% of what the
#   ranks 0 sent to the other leaf and one of leaf 2's >= 90% of the way
#   back, "apart" when neither, else "mixed" (not counted: an all-to-all
#   waits for both ways: runs counted apart by leaf 1 alone moved
#   4.04-4.13 MB/s on two guests, leaf 1's uplinks a third empty, as a
#   collision on the way back leaves them, against 4.8-4.95 in the rest).
#   Runs repeat (new QPNs, new ports) until each kind was seen
#   BUNDLE_BENCH_RUNS times (default 2), or BUNDLE_BENCH_TRIES (default
#   6 x that) ran out.
# - with shunt (active, PATHS paths per rail, default 8), per spread mode in
#   BUNDLE_BENCH_SPREAD (default "split auto"): split cuts each message over
#   the 8 source ports at once; auto splits or keeps a message on the
#   application's QP, whichever moved its bytes faster lately. (pin and
#   flowlet keep a WRITE_WITH_IMM, two-sided, on the application's QP: with
#   one per message they spread nothing here.) These runs are classified
#   too, by the spine each sender's application QP took (an nft set on each
#   spine records the RoCE packets' source ports; shunt's stats name the
#   application QP's), and repeat the same way: where the application's
#   QPs collide matters to auto. Split's runs count for both kinds (it
#   spreads every message whichever spine its application QPs took).
#   carrier (not by default): pin, with SHUNT_STEER=queue moving each QP's
#   work whole off a congested spine; host agents (started first, as
#   separate processes) probe every path's source port.
# Reported: the sum of both jobs' throughput (size / time per iteration,
# MB/s), the median of each kind's runs, and shunt's ratio to the
# baseline of the same kind (targets: >= 1.6x collided, >= 0.95x apart).
# Runs of the same placement without shunt differ by up to a tenth (2.40
# to 2.82 MB/s collided on two guests): one run each is not a figure.
SHUNT_ROOT=$(cd "$(dirname "$0")/.." && pwd)
. "$SHUNT_ROOT/test/fabric/lib.sh"
need_guests
LIB=$B/lib/libshunt.so
BENCH=$B/bin/shunt-bench
# The guests are emulated (TCG); on two host cores four guests at 20 Mbit/s
# moved, placed apart, only 64% of what the spines carry (at 5: 94%, and
# twice the collided placement, as the fabric alone would give), and split
# still paid for their CPUs at 5 (docs/design.md). Two guests, one job
# process each per guest: 10 Mbit/s, where the contention scenario's
# spines ran 97% full.
HOSTS=${BUNDLE_BENCH_HOSTS:-2}
case $HOSTS in 2) RATE=${BUNDLE_BENCH_RATE:-10} ;; 4) RATE=${BUNDLE_BENCH_RATE:-5} ;; *) fail "BUNDLE_BENCH_HOSTS is 2 or 4, not $HOSTS" ;; esac
DUR=${BUNDLE_BENCH_SECONDS:-25}
RUNS=${BUNDLE_BENCH_RUNS:-2}
TRIES=${BUNDLE_BENCH_TRIES:-$((6 * RUNS))}
WARMUP=${BUNDLE_BENCH_WARMUP:-2}  # untimed iterations first (shunt-bench -w)
SPREADS=${BUNDLE_BENCH_SPREAD:-split auto}
PATHS=${BUNDLE_BENCH_PATHS:-8}
QUEUE_MS=${BUNDLE_BENCH_QUEUE_MS:-1000}
# BUNDLE_BENCH_ENV="VAR=VALUE ...": more of libshunt's settings for the runs with it
# carrier steering needs probes that follow each path: routers hashing
# addresses and UDP source port only (the probes go to another port)
hash=()
case " $SPREADS " in *" carrier "*) hash=(--ecmp-hash sport) ;; esac
up --hosts "$HOSTS" --rails 1 --spines 2 --hosts-per-leaf $((HOSTS / 2)) "${hash[@]}"
# job A's and job B's hosts (rank 0 first), and who probes whom
if [ "$HOSTS" = 2 ]; then ja=(h1 h2) jb=(h1 h2) pairs="h1:h2 h2:h1"; else ja=(h1 h3) jb=(h2 h4) pairs="h1:h3 h3:h1 h2:h4 h4:h2"; fi
# A deep queue (1 s), small messages and a long ACK timeout (--qp-timeout
# 18, about 1 s): rxe 6.1 recovers badly from drops and retransmissions
# (go-back-N after a timeout, at worst a remote invalid request error, seen
# with and without shunt), so the spines must queue, not drop.
for l in 1 2; do for s in 1 2; do
  fab fault rate "l${l}r0-s$s" "$RATE" --queue-ms "$QUEUE_MS" >/dev/null || fail "rate l${l}r0-s$s"
done; done
command -v nft >/dev/null || fail "no nft (make deps)"
sport_watch
KEY=bench-$$
case " $SPREADS " in *" carrier "*)
  # Each host's agent before the jobs: the first preloaded process of a
  # host to open a socket becomes its agent, and its probe engine learns
  # the peer's clock and clear base delay before the jobs load the spines.
  for pair in $pairs; do
    h=${pair%:*} p=${pair#*:}
    fab exec "$h" -- env LD_PRELOAD="$LIB" SHUNT_JOB_KEY="$KEY" SHUNT_PROBE_ADDRS="$(fab addr "$h" r0)" \
      SHUNT_PROBE_NAME="$(fab addr "$h" r0)" SHUNT_PEERS="$(fab addr "$p" r0)=$(fab addr "$p" r0)" \
      SHUNT_PATH_DEAD_MS=8000 \
      python3 -c "import socket, time; s = socket.socket(); time.sleep(3000)" > "$TMP/agent-$h.log" 2>&1 &
  done
  sleep 8
  for h in h1 h2 h3 h4; do [ -s "$TMP/agent-$h.log" ] && { echo "  agent on $h:"; sed 's/^/    /' "$TMP/agent-$h.log"; }; done ;;
esac

# pair WITH TAG A B PORT: a 2-rank job, rank 0 on host A; prints busbw
job() {
  local with=$1 tag=$2 a=$3 b=$4 port=$5 env=()
  local spread=$with steer=off
  [ "$with" = carrier ] && spread=pin steer=queue
  [ "$with" != plain ] && env=(env LD_PRELOAD="$LIB" SHUNT_MODE=active SHUNT_SPREAD="$spread" SHUNT_STEER="$steer" SHUNT_SPLIT_MIN_BYTES=65536 SHUNT_JOB_KEY="$KEY" SHUNT_PATHS_PER_RAIL="$PATHS"
    SHUNT_PATH_DEAD_MS=8000 SHUNT_STATS_FILE=/tmp/bundle-bench-$tag.json SHUNT_LOG_LEVEL=info ${BUNDLE_BENCH_ENV:-})  # queues of up to 1 s: no path is declared dead for that
  local boot
  boot=$(fab addr "$a" r0)
  # one WRITE_WITH_IMM per 256 KiB message (split cuts it, the others do not)
  local args=(--world 2 --bootstrap "$boot:$port" --transport verbs -d rxe0 --verb write_imm -b 256K -e 256K
    --duration "$DUR" -w "$WARMUP" -c 1 --seg 256K --qp-timeout 18 --stall-timeout 60)
  fab exec "$b" -- timeout 200 "${env[@]}" "$BENCH" --rank 1 "${args[@]}" > "$TMP/$tag-1" 2>&1 &
  local p=$!
  fab exec "$a" -- timeout 200 "${env[@]}" "$BENCH" --rank 0 "${args[@]}" > "$TMP/$tag-0" 2>&1
  local rc=$?
  wait $p || rc=1
  return $rc
}

# round WITH -> "busbw_sum s1_bytes s2_bytes"
round() {
  local with=$1 port=$((30000 + RANDOM % 2000)) sp
  for sp in s1 s2; do ip netns exec "sf-$NAME-$sp" nft flush set ip sportseen roce || fail "nft flush on $sp"; done
  snap a
  job "$with" A "${ja[@]}" $port & local pa=$!
  job "$with" B "${jb[@]}" $((port + 1)) & local pb=$!
  wait $pa || { cat "$TMP/A-0" "$TMP/A-1" >&2; fail "job A ($with) failed"; }
  wait $pb || { cat "$TMP/B-0" "$TMP/B-1" >&2; fail "job B ($with) failed"; }
  snap b
  local bw s1 s2
  # MB/s each job moved (bytes / time of the row): the busbw column has
  # three decimals of GB/s, too coarse for emulated links
  bw=$(for t in A B; do grep -v '^#' "$TMP/$t-0" | awk '$1 ~ /^[0-9]+$/ && NF == 13 && $9 == 0 { print $1 / $6 }'; done |
    awk '{ s += $1; n++ } END { if (n == 2) printf "%.2f", s; else print "nan" }')
  # leaf 1's uplinks carry the two jobs' data from rank 0 to rank 1
  s1=$(delta a b l1r0-s1 up_bytes)
  s2=$(delta a b l1r0-s2 up_bytes)
  # and leaf 2's the way back (rank 1 to rank 0)
  echo "$bw $s1 $s2 $(delta a b l2r0-s1 up_bytes) $(delta a b l2r0-s2 up_bytes)"
}

# prim_spine H TAG -> the spine (s1, s2, ? when unknown) that job TAG's
# rank 0's application QP on host H sent its packets through, in the last
# round
prim_spine() {
  local port sp
  port=$(fab exec "$1" -- cat "/tmp/bundle-bench-$2.json" 2>/dev/null | python3 -c '
import json, sys
for q in json.load(sys.stdin)["verbs"]["qps"]:
    b = q.get("bundle")
    if b and b["primary"].get("udp_sport"):
        print(b["primary"]["udp_sport"])
        break' 2>/dev/null)
  [ -n "$port" ] || { echo "?"; return; }
  for sp in s1 s2; do
    case " $(sport_seen "$sp" roce) " in *" $(fab addr "$1" r0):$port "*) echo "$sp"; return ;; esac
  done
  echo "?"
}

# the runs of each kind, without shunt (plain) and per spread: "MB/s ..."
declare -A with
enough() { local n; for n in $(wc -w <<< "${with[$1,collided]:-}") $(wc -w <<< "${with[$1,apart]:-}"); do [ "$n" -ge "$RUNS" ] || return 1; done; }
# placement BYTES_SPINE1 BYTES_SPINE2 -> collided (one spine carried >= 90%) or apart
placement() { if [ $(($1 * 10)) -ge $((($1 + $2) * 9)) ] || [ $(($2 * 10)) -ge $((($1 + $2) * 9)) ]; then echo collided; else echo apart; fi; }
median() { python3 -c 'import statistics, sys; print("%.2f" % statistics.median(map(float, sys.argv[1:])))' "$@"; }
for ((i = 1; i <= TRIES; i++)); do
  round plain > "$TMP/round"
  read -r bw s1 s2 r1 r2 < "$TMP/round"
  kind=$(placement "$s1" "$s2")
  [ "$(placement "$r1" "$r2")" = "$kind" ] || kind=mixed
  echo "  without shunt, run $i: $bw MB/s, spine 1 $s1 B, spine 2 $s2 B; back: $r1 B, $r2 B: $kind"
  [ "$bw" = nan ] || [ $kind = mixed ] || with[plain,$kind]+="$bw "
  enough plain && break
done
for sp in $SPREADS; do for ((i = 1; i <= TRIES; i++)); do
  round "$sp" > "$TMP/round"
  read -r bw s1 s2 r1 r2 < "$TMP/round"
  pa=$(prim_spine "${ja[0]}" A) pb=$(prim_spine "${jb[0]}" B)
  kind=apart
  [ "$pa" = "$pb" ] && kind=collided
  [ "$pa" = "?" ] || [ "$pb" = "?" ] && kind=unknown
  echo "  with shunt ($PATHS paths, $sp), run $i: $bw MB/s, spine 1 $s1 B, spine 2 $s2 B; application QPs on $pa, $pb: $kind"
  if [ "$sp" = split ]; then
    # split spreads every message whichever spine the application's QPs
    # took: each run stands for both placements
    [ "$bw" = nan ] || { with[$sp,collided]+="$bw "; with[$sp,apart]+="$bw "; }
  else
    [ $kind = unknown ] || [ "$bw" = nan ] || with[$sp,$kind]+="$bw "
  fi
  # where path discovery placed each sender's shadows (routers two hops out)
  grep -h 'shadows over\|no router answered' "$TMP/A-0" "$TMP/B-0" | sed 's/^/    /' || true
  for ht in "${ja[0]}:A" "${jb[0]}:B"; do  # how each job's sender spread its bytes (MB per path, by UDP source port)
    h=${ht%:*}
    fab exec $h -- cat "/tmp/bundle-bench-${ht#*:}.json" 2>/dev/null | python3 -c '
import json, sys
for q in json.load(sys.stdin)["verbs"]["qps"]:
    b = q.get("bundle")
    if b and b["paths"]:
        a = b.get("auto")
        rt = lambda x: (x.get("router") or "?").split(".")[-1]
        print("    '$h' QP %d: primary %.1f MB via %s, paths %s%s%s" % (q["qpn"], b["primary"]["bytes"] / 1e6, rt(b["primary"]),
              " ".join("%d:%.1f@%s" % (p["udp_sport"], p["bytes"] / 1e6, rt(p)) for p in b["paths"]),
              "; auto: %s, %d split %.0f ns/KiB, %d pinned %.0f ns/KiB" % (a["now"], a["split_periods"],
              a["split_ns_per_kib"], a["pin_periods"], a["pin_ns_per_kib"]) if a else "",
              "; steering %s, %d carrier moves, queues known on %d paths" % (b["steer"], b.get("carrier_steers", 0),
              sum(1 for p in b["paths"] if p.get("queue"))) if b["steer"] == "queue-carrier" else ""))
        if b.get("carrier_steering"):
            c = b["carrier_steering"]
            print("      queues (ms, C congested, router):", " ".join("%d:%.1f%s@%s" % (i, p["queue"]["excess_ns"] / 1e6,
                  "C" if p["queue"]["congested"] else "", (p.get("router") or "?").split(".")[-1]) for i, p in enumerate(b["paths"]) if p.get("queue")),
                  "; carrier [verdict, ms, threshold ms]", [round(x, 1) for x in c["carrier_queue"]], "; application QP via", c["application_qp_router"] or "?", "; the peer said", c["peer_view"], "%d ms ago" % c["peer_view_age_ms"])' || true
  done
  enough "$sp" && break
done; done
ratio() { python3 -c "print('%.2fx' % ($1 / $2))"; }
echo "two jobs across $RATE Mbit/s spines on $HOSTS guests, MB/s summed over both, medians (the runs):"
for sp in $SPREADS; do
  for kind in collided apart; do
    target=1.6
    [ $kind = apart ] && target=0.95
    b=${with[plain,$kind]:-} w=${with[$sp,$kind]:-}
    if [ -n "$b" ] && [ -n "$w" ]; then
      # shellcheck disable=SC2086
      mb=$(median $b) mw=$(median $w)
      printf '  %s, %-9s without %s (%s), with %s (%s): %s (target >= %sx)\n' "$sp" "$kind:" "$mb" "${b% }" "$mw" "${w% }" \
        "$(ratio "$mw" "$mb")" $target
    else
      printf '  %s, %-9s %s\n' "$sp" "$kind:" "no such placement in $TRIES runs (without shunt: ${b:-none}, with: ${w:-none})"
    fi
  done
done
