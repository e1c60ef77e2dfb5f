"""primitives.py: torch.distributed's six primitives, a global mean loss and
a sub-group, on the dcomm backend (the examples of the seeds' tutorial, on
CPU tensors). Run with 2 or more ranks:

    dcomm-run --nproc-per-node 4 -- python3 examples/torch/primitives.py
    python3 -m torch.distributed.run -r 2 -t 1 --nproc_per_node 4 examples/torch/primitives.py

(torch 1.13's torchrun on Python 3.11 needs -r/-t; see dcomm_torch(7).)
"""
import os

import torch
import torch.distributed as dist

import dcomm.torch  # noqa: F401  registers the "dcomm" backend


def main():
    dist.init_process_group(backend="dcomm", init_method="env://")
    rank, world = dist.get_rank(), dist.get_world_size()
    print(f"rank:{rank}, local_rank:{os.environ.get('LOCAL_RANK')}, world_size:{world}")

    tensor = torch.tensor([1.0, 2.0])
    dist.all_reduce(tensor, op=dist.ReduceOp.SUM)  # every rank: the sum, in place
    assert tensor.tolist() == [world * 1.0, world * 2.0]

    tensor = torch.tensor([1.0, 2.0])
    dist.reduce(tensor, dst=0, op=dist.ReduceOp.SUM)  # only rank 0 gets the sum; the others keep theirs
    assert tensor.tolist() == ([world * 1.0, world * 2.0] if rank == 0 else [1.0, 2.0])

    local = torch.tensor([float(rank)])
    gathered = [torch.zeros_like(local) for _ in range(world)]
    dist.all_gather(gathered, local)  # gathered[i] is rank i's tensor
    assert [t.item() for t in gathered] == [float(i) for i in range(world)]

    tensor = torch.tensor([10.0, 20.0, 30.0]) if rank == 0 else torch.zeros(3)
    dist.broadcast(tensor, src=0)
    assert tensor.tolist() == [10.0, 20.0, 30.0]

    scatter_list = [torch.full((2,), float(i)) for i in range(world)] if rank == 0 else None
    recv = torch.zeros(2)
    dist.scatter(recv, scatter_list, src=0)  # rank i receives scatter_list[i]
    assert recv.tolist() == [float(rank)] * 2

    dist.barrier()

    loss = torch.tensor(2.0 + rank)  # the global mean loss
    dist.all_reduce(loss, op=dist.ReduceOp.SUM)
    loss = loss / world
    if rank == 0:
        print(f"global loss: {loss.item()}")

    group = dist.new_group(ranks=[0, 1])  # only ranks 0 and 1 take part
    if rank in (0, 1):
        t = torch.ones(1)
        dist.all_reduce(t, group=group)
        assert t.item() == 2.0
    # Every rank, rank 2 and up too, has left new_group (which waits on torch's store) before any
    # rank exits: under dcomm-run with env:// rank 0 hosts that store.
    dist.barrier()
    dist.destroy_process_group()
    if rank == 0:
        print("all primitives passed")


if __name__ == "__main__":
    main()
