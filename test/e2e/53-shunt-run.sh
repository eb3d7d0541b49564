#!/usr/bin/env bash
# shunt-run preloads libshunt (after sanitizer runtimes, keeping the rest),
# sets NCCL_IBVERBS_LIB and a job key, and works in the real launch forms:
# plain, `shunt-run torchrun ...`, `torchrun --no_python shunt-run ...` and
# `mpirun -x SHUNT_JOB_KEY ... shunt-run ...`; every rank's traffic counted.
# timeout: 300
. "$(dirname "$0")/../lib.sh"
RUN=$B/bin/shunt-run
[ -x "$RUN" ] || fail "shunt-run not built"
export SHUNT_MODE=observe SHUNT_RUN_DIR=$TMP/run SHUNT_METRICS_ADDR=off
mkdir -p "$SHUNT_RUN_DIR"
unset SHUNT_JOB_KEY NCCL_IBVERBS_LIB

expect_eq "$("$RUN" --print-lib)" "$(readlink -f "$LIB")" "libshunt found from the build tree"
# Installed layout: PREFIX/bin/shunt-run finds PREFIX/lib/shunt/libshunt.so.
mkdir -p "$TMP/prefix/bin" "$TMP/prefix/lib/shunt"
cp "$RUN" "$TMP/prefix/bin/" && cp "$LIB" "$TMP/prefix/lib/shunt/"
expect_eq "$("$TMP/prefix/bin/shunt-run" --print-lib)" "$TMP/prefix/lib/shunt/libshunt.so" "libshunt found when installed"
expect_eq "$(PATH=$TMP/prefix/bin:$PATH shunt-run --print-lib)" "$TMP/prefix/lib/shunt/libshunt.so" "found through PATH"

# LD_PRELOAD order: sanitizer runtime first, libshunt, then what was there.
mkdir -p "$TMP/san" "$TMP/other"
echo 'int shunt_run_test_dummy;' > "$TMP/d.c"
cc -shared -fPIC -o "$TMP/san/libasan.so.8" "$TMP/d.c" && cp "$TMP/san/libasan.so.8" "$TMP/other/libfoo.so"
env_of() { /usr/bin/python3 -c 'import os, sys; print(os.environ.get(sys.argv[1], ""))' "$1"; }
got=$(LD_PRELOAD="$TMP/other/libfoo.so:$TMP/san/libasan.so.8" "$RUN" -- /usr/bin/python3 -c 'import os; print(os.environ["LD_PRELOAD"])')
expect_eq "$got" "$TMP/san/libasan.so.8:$(readlink -f "$LIB"):$TMP/other/libfoo.so" "LD_PRELOAD order"
got=$(LD_PRELOAD="$LIB" "$RUN" /usr/bin/python3 -c 'import os; print(os.environ["LD_PRELOAD"])')
expect_eq "$got" "$(readlink -f "$LIB")" "libshunt preloaded once"
expect_eq "$("$RUN" /usr/bin/python3 -c 'import os; print(os.environ["NCCL_IBVERBS_LIB"])')" "$(readlink -f "$LIB")" "NCCL_IBVERBS_LIB"
expect_eq "$(NCCL_IBVERBS_LIB=libibverbs.so.1 "$RUN" /usr/bin/python3 -c 'import os; print(os.environ["NCCL_IBVERBS_LIB"])')" libibverbs.so.1 "NCCL_IBVERBS_LIB kept when set"
key=$("$RUN" /usr/bin/python3 -c 'import os; print(os.environ["SHUNT_JOB_KEY"])')
[[ $key =~ ^[0-9a-f]{64}$ ]] || fail "made job key '$key'"
expect_eq "$(SHUNT_JOB_KEY=k1 "$RUN" /usr/bin/python3 -c 'import os; print(os.environ["SHUNT_JOB_KEY"])')" k1 "job key kept when set"
"$RUN" /bin/sh -c 'exit 7'; expect_eq $? 7 "exit status passed through"
"$RUN" 2>/dev/null; expect_eq $? 64 "no command: usage error"
# SHUNT_JOB_KEY_FILE: the first shunt-run makes the file (0600), later
# ones keep it, none puts a key of its own in the environment; libshunt
# reads it, and a file that gives no key turns shunt off, named.
kf=$TMP/keys/job.key
mkdir -p "$TMP/keys"
got=$(SHUNT_JOB_KEY_FILE=$kf "$RUN" /usr/bin/python3 -c 'import os; print(os.environ.get("SHUNT_JOB_KEY", "unset"))')
expect_eq "$got" unset "no key made in the environment with SHUNT_JOB_KEY_FILE"
[[ $(cat "$kf") =~ ^[0-9a-f]{64}$ ]] || fail "key file holds '$(cat "$kf")'"
expect_eq "$(stat -c %a "$kf")" 600 "key file mode"
first=$(cat "$kf")
SHUNT_JOB_KEY_FILE=$kf "$RUN" /bin/true
expect_eq "$(cat "$kf")" "$first" "a second shunt-run keeps the file's key"
expect_eq "$(ls "$TMP/keys")" job.key "no temporary file left"
sock='import socket; socket.socket()'
out=$(SHUNT_JOB_KEY_FILE=$kf "$RUN" /usr/bin/python3 -c "$sock" 2>&1)
[ -z "$out" ] || fail "a good key file: $out"
out=$(SHUNT_JOB_KEY_FILE=$TMP/keys "$RUN" /usr/bin/python3 -c "$sock" 2>&1)
[[ $out == *"shunt: SHUNT_JOB_KEY_FILE='$TMP/keys' is a directory, not a regular file; shunt is off for this process"* ]] ||
  fail "a directory as key file: '$out'"
ok "a bad key file: $out"

# Plain: the preload is live, the pair's bytes counted exactly.
port=$(free_port)
SHUNT_STATS_FILE=$TMP/srv.json "$RUN" "$B/test/tcp_pair" server "$port" & srv=$!
SHUNT_STATS_FILE=$TMP/cli.json "$RUN" -- "$B/test/tcp_pair" client "$port" || fail "plain client"
wait $srv || fail "plain server"
expect_eq "$(jget "$TMP/cli.json" 'sum(s["tx_bytes"] for s in d["sockets"])')" 12000 "plain: client bytes counted"

# A worker that does real collective traffic over loopback and says what it saw.
cat > "$TMP/worker.py" <<'PY'
import json, os, sys
out = {k: os.environ.get(k, "") for k in ("LD_PRELOAD", "SHUNT_JOB_KEY", "NCCL_IBVERBS_LIB", "RANK")}
if sys.argv[1] == "torch":
    import torch, torch.distributed as dist
    dist.init_process_group("gloo")
    t = torch.ones(1 << 16) * (dist.get_rank() + 1)
    dist.all_reduce(t)
    out["sum"] = float(t[0])
    dist.destroy_process_group()
else:
    import socket
    s = socket.socket(); s.bind(("127.0.0.1", 0)); s.listen(1)
    c = socket.create_connection(s.getsockname()); a, _ = s.accept()
    c.sendall(b"x" * 1000); n = 0
    while n < 1000: n += len(a.recv(4096))
    out["RANK"] = os.environ.get("OMPI_COMM_WORLD_RANK", "")
out["pid"] = os.getpid()
open(os.path.join(sys.argv[2], "w-%d.json" % os.getpid()), "w").write(json.dumps(out))
PY
check_workers() {  # DIR N WHAT: N workers, all preloaded, one key, stats with their rank
  python3 - "$1" "$2" "$(readlink -f "$LIB")" <<'PY' || fail "$3"
import glob, json, os, sys
d, n, lib = sys.argv[1], int(sys.argv[2]), sys.argv[3]
ws = [json.load(open(f)) for f in glob.glob(d + "/w-*.json")]
assert len(ws) == n, ws
assert all(w["LD_PRELOAD"].split(":")[0] == lib for w in ws), ws
assert len({w["SHUNT_JOB_KEY"] for w in ws}) == 1 and ws[0]["SHUNT_JOB_KEY"], "workers disagree on the key"
assert sorted(w["RANK"] for w in ws) == [str(i) for i in range(n)], ws
for w in ws:
    st = json.load(open(d + "/stats-%d.json" % w["pid"]))
    assert st["rank"] == w["RANK"], (st["rank"], w)
    tx = sum(s["tx_bytes"] for s in st["sockets"])
    assert tx > 0, "rank %s sent nothing through shunt" % w["RANK"]
    print("rank", w["RANK"], "tx bytes", tx, "sum", w.get("sum"))
PY
  ok "$3"
}

if [ -x /usr/bin/torchrun ] && /usr/bin/python3 -c 'import torch.distributed' 2>/dev/null; then
  for form in outer inner; do
    d=$TMP/torch-$form; mkdir -p "$d"
    tport=$(free_port)
    targs=(--nnodes 1 --nproc_per_node 2 -r 1 -t 1 --master_addr 127.0.0.1 --master_port "$tport")
    if [ $form = outer ]; then
      SHUNT_STATS_FILE=$d/stats-%p.json timeout 200 "$RUN" /usr/bin/torchrun "${targs[@]}" "$TMP/worker.py" torch "$d" \
        > "$d/log" 2>&1 || { tail -20 "$d/log"; fail "shunt-run torchrun"; }
    else
      SHUNT_JOB_KEY=$key SHUNT_STATS_FILE=$d/stats-%p.json timeout 200 /usr/bin/torchrun "${targs[@]}" --no_python \
        "$RUN" /usr/bin/python3 "$TMP/worker.py" torch "$d" > "$d/log" 2>&1 || { tail -20 "$d/log"; fail "torchrun --no_python shunt-run"; }
    fi
    expect_eq "$(jget "$(ls "$d"/w-*.json | head -1)" 'd["sum"]')" 3.0 "torch all_reduce result ($form)"
    check_workers "$d" 2 "torchrun form '$form': both ranks preloaded, one key, traffic counted"
  done
else
  echo "torchrun not installed (python3-torch): torchrun forms not run"
fi

if command -v mpirun >/dev/null; then
  d=$TMP/mpi; mkdir -p "$d"
  export SHUNT_JOB_KEY=$key SHUNT_STATS_FILE=$d/stats-%p.json
  timeout 120 mpirun --allow-run-as-root --oversubscribe -np 2 --mca btl self,vader \
    --mca oob_tcp_if_include lo --mca btl_tcp_if_include lo \
    -x SHUNT_JOB_KEY -x SHUNT_STATS_FILE -x SHUNT_MODE -x SHUNT_RUN_DIR -x SHUNT_METRICS_ADDR \
    "$RUN" /usr/bin/python3 "$TMP/worker.py" sock "$d" > "$d/log" 2>&1 || { tail -20 "$d/log"; fail "mpirun shunt-run"; }
  unset SHUNT_JOB_KEY SHUNT_STATS_FILE
  check_workers "$d" 2 "mpirun -x SHUNT_JOB_KEY shunt-run: both ranks preloaded, one key, traffic counted"
else
  echo "mpirun not installed (openmpi-bin): mpirun form not run"
fi
