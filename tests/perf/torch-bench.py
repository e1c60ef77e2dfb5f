"""torch-bench.py: torch.distributed all_reduce and a DDP step, dcomm vs gloo.

Run on every rank, one backend per run (the benchmark's numbers are the
slowest rank's):

    dcomm-run --quiet-prefix --nproc-per-node 2 -- python3 tests/perf/torch-bench.py dcomm
    dcomm-run --quiet-prefix --nproc-per-node 2 -- python3 tests/perf/torch-bench.py gloo

Prints, on rank 0, `allreduce <bytes> <us>` rows (float32, 8 B to 64 MiB:
16 warm-up calls, barrier, back-to-back calls, slowest rank's mean) and one
`ddp_step <us>` row (a 3-layer MLP, 1M parameters, batch 32 per rank).
tests/perf/compare-torch.sh runs both backends interleaved, fastest of 3.
"""
import sys
import time

import torch
import torch.distributed as dist

import dcomm.torch  # noqa: F401


def timed(fn, iters, warmup=16):
    # 16 untimed calls, as dcomm-bench: they cover the tcp backend's trial
    # of the single copy (its first 14 calls of each size from 1 MiB)
    for _ in range(warmup):
        fn()
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    dt = torch.tensor([(time.perf_counter() - t0) / iters])
    dist.all_reduce(dt, op=dist.ReduceOp.MAX)
    return dt.item() * 1e6


def main():
    backend = sys.argv[1]
    maxbytes = int(sys.argv[2]) if len(sys.argv) > 2 else 64 << 20
    dist.init_process_group(backend, init_method="env://")
    rank = dist.get_rank()
    size = 8
    while size <= maxbytes:
        t = torch.ones(size // 4)
        iters = max(3, min(1000, (256 << 20) // (size * 8)))
        us = timed(lambda: dist.all_reduce(t), iters)
        if rank == 0:
            print(f"allreduce {size} {us:.2f}", flush=True)
        size *= 4
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(512, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 512),
                                torch.nn.ReLU(), torch.nn.Linear(512, 10))
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    x, y = torch.randn(32, 512), torch.randint(0, 10, (32,))

    def step():
        opt.zero_grad()
        torch.nn.functional.cross_entropy(ddp(x), y).backward()
        opt.step()
    us = timed(step, 30)
    if rank == 0:
        print(f"ddp_step {us:.1f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
