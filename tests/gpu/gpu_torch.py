"""gpu_torch.py: the torch backend "dcomm" on CUDA tensors (DCOMM_BACKEND=nccl),
one process per GPU under dcomm-run (tests/gpu/run.sh step 9). Needs a CUDA
build of torch. Checks all_reduce, broadcast, all_gather, reduce_scatter,
uneven all_to_all (grouped send/recv), async ops on torch's current stream,
a CPU tensor refused, and DDP; prints `GPU checks: N passed, M failed`.
"""
import os
import sys

import torch
import torch.distributed as dist

import dcomm
import dcomm.torch  # noqa: F401

PASS, FAIL = 0, 0


def check(cond, what):
    global PASS, FAIL
    if cond:
        PASS += 1
        print(f"ok   {what}", flush=True)
    else:
        FAIL += 1
        print(f"FAIL {what}", flush=True)


def main():
    if not torch.cuda.is_available():
        print("GPU checks: 0 passed, 0 failed (torch has no CUDA)")
        sys.exit(77)
    local = int(os.environ.get("LOCAL_RANK", "0"))
    torch.cuda.set_device(local)
    dist.init_process_group("dcomm")
    rank, n = dist.get_rank(), dist.get_world_size()
    dev = torch.device("cuda", local)
    t = torch.full((1 << 20,), float(rank + 1), device=dev)
    dist.all_reduce(t)
    check(torch.all(t == n * (n + 1) / 2).item(), "all_reduce float32 1M on the GPU")
    b = torch.arange(10, device=dev, dtype=torch.float64) if rank == 0 else torch.zeros(10, device=dev,
                                                                                         dtype=torch.float64)
    dist.broadcast(b, 0)
    check(torch.equal(b.cpu(), torch.arange(10, dtype=torch.float64)), "broadcast float64")
    outs = [torch.zeros(3, device=dev) for _ in range(n)]
    dist.all_gather(outs, torch.full((3,), float(rank), device=dev))
    check(all(o[0].item() == i for i, o in enumerate(outs)), "all_gather")
    out = torch.zeros(4, device=dev)
    dist.reduce_scatter(out, [torch.full((4,), float(i), device=dev) for i in range(n)])
    check(torch.all(out == rank * n).item(), "reduce_scatter")
    send = [torch.full((j + 1,), float(rank), device=dev) for j in range(n)]
    recv = [torch.zeros(rank + 1, device=dev) for _ in range(n)]
    dist.all_to_all(recv, send)
    check(all(torch.all(r == j).item() for j, r in enumerate(recv)), "uneven all_to_all")
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        x = torch.ones(1 << 16, device=dev) * (rank + 1)
        w = dist.all_reduce(x, async_op=True)
    w.wait()
    torch.cuda.synchronize()
    check(torch.all(x == n * (n + 1) / 2).item(), "async all_reduce on a side stream")
    try:
        dist.all_reduce(torch.ones(2))
        check(False, "a CPU tensor on the nccl world was accepted")
    except dcomm.InvalidArgument as e:
        check("DCOMM_BACKEND" in str(e), "a CPU tensor is refused, naming DCOMM_BACKEND")
    model = torch.nn.Linear(32, 8).to(dev)
    ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=[local])
    ddp(torch.randn(16, 32, device=dev)).sum().backward()
    g = model.weight.grad.clone()
    gs = [torch.zeros_like(g) for _ in range(n)]
    dist.all_gather(gs, g)
    check(all(torch.equal(gs[0], x) for x in gs), "DDP gradients equal on every GPU")
    dist.destroy_process_group()
    print(f"GPU checks: {PASS} passed, {FAIL} failed", flush=True)
    sys.exit(1 if FAIL else 0)


if __name__ == "__main__":
    main()
