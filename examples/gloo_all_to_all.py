#!/usr/bin/python3
"""PyTorch Gloo all_to_all_single loop that verifies every iteration.

usage: gloo_all_to_all.py RANK WORLD MASTER_ADDR MASTER_PORT SECONDS [IFACE]

Each rank sends rank*1000+dst+i (mod 2^20) to every peer, as 256 KiB
blocks; every received block is checked. Runs until rank 0 has seen SECONDS
pass (the decision travels in the loop), with the process group timeout at
10 s. Prints one line per second and a summary with the worst iteration
time; exits 1 on a wrong result, 2 on a collective error.
"""
import datetime
import os
import sys
import time

import torch
import torch.distributed as dist

rank, world = int(sys.argv[1]), int(sys.argv[2])
addr, port, seconds = sys.argv[3], int(sys.argv[4]), float(sys.argv[5])
if len(sys.argv) > 6:
    os.environ["GLOO_SOCKET_IFNAME"] = sys.argv[6]
dist.init_process_group("gloo", init_method=f"tcp://{addr}:{port}", rank=rank, world_size=world,
                        timeout=datetime.timedelta(seconds=10))
n = 64 * 1024  # int32 per peer block
start = time.time()
it, worst, last_print = 0, 0.0, start
flag = torch.zeros(1, dtype=torch.int32)
try:
    while True:
        t0 = time.time()
        inp = torch.cat([torch.full((n,), (rank * 1000 + d + it) % (1 << 20), dtype=torch.int32)
                         for d in range(world)])
        out = torch.empty_like(inp)
        dist.all_to_all_single(out, inp)
        for s in range(world):
            want = (s * 1000 + rank + it) % (1 << 20)
            blk = out[s * n:(s + 1) * n]
            if not bool((blk == want).all()):
                print(f"rank {rank}: WRONG result at iteration {it} from {s}", flush=True)
                sys.exit(1)
        flag[0] = 1 if (rank == 0 and time.time() - start >= seconds) else 0
        dist.broadcast(flag, 0)
        dt = time.time() - t0
        worst = max(worst, dt)
        it += 1
        if time.time() - last_print >= 1:
            last_print = time.time()
            print(f"rank {rank}: t={last_print - start:.1f}s it={it} worst={worst:.2f}s", flush=True)
        if flag[0]:
            break
        time.sleep(0.02)
except RuntimeError as e:
    print(f"rank {rank}: FAILED after {time.time() - start:.1f}s at iteration {it}: {e}", flush=True)
    sys.exit(2)
print(f"rank {rank}: OK iterations={it} seconds={time.time() - start:.1f} worst_iteration={worst:.2f}s",
      flush=True)
dist.destroy_process_group()
