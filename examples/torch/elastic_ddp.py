"""elastic_ddp.py: DDP training that survives a dead rank without restarting anyone.

A small float64 MLP learns a fixed regression task. Every step takes the
same global batch (48 samples), split over whichever ranks are alive, so the
result does not depend on the world size: a run that loses a rank ends with
the failure-free run's loss (to rounding). Checkpoints (model + optimizer)
are committed by rank 0 every --checkpoint-every steps. Run under dcomm-run:

    dcomm-run --nproc-per-node 4 -- python3 examples/torch/elastic_ddp.py \\
        --steps 40 --checkpoint-every 5 --checkpoint-dir /tmp/ckpt --kill-rank 2 --kill-at-step 17

--kill-rank R --kill-at-step S: rank R SIGKILLs itself at step S (first
world only); --kill-in-save: instead, rank 0 dies while it writes the
checkpoint of step S. Rank 0 ends with
`final step=N world=W generation=G loss=L`.
"""
import argparse
import os
import signal

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import dcomm
import dcomm.torch

GLOBAL_BATCH = 48
DIM = 8


def batch(step):
    """The global batch of a step: the same on every rank and world size."""
    g = torch.Generator().manual_seed(1000 + step)
    x = torch.randn(GLOBAL_BATCH, DIM, generator=g, dtype=torch.float64)
    w = torch.arange(1, DIM + 1, dtype=torch.float64) / DIM
    y = (x @ w).sin().unsqueeze(1) + 0.1 * x[:, :1]
    return x, y


def make_model():
    torch.manual_seed(7)
    return torch.nn.Sequential(torch.nn.Linear(DIM, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1)).double()


def full_loss(model):
    with torch.no_grad():
        x, y = batch(10**6)
        return torch.nn.functional.mse_loss(model(x), y).item()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--checkpoint-every", type=int, default=5)
    ap.add_argument("--checkpoint-dir", default="/tmp/dcomm-elastic-ddp")
    ap.add_argument("--kill-rank", type=int, default=-1)
    ap.add_argument("--kill-at-step", type=int, default=-1)
    ap.add_argument("--kill-in-save", action="store_true")
    ap.add_argument("--lr", type=float, default=0.1)
    a = ap.parse_args()

    dist.init_process_group("dcomm", init_method="dcomm://")
    first_generation = dcomm.generation()
    first_life = not dcomm.is_joiner() and os.environ.get("DCOMM_RESTART_COUNT", "0") == "0"
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=a.lr, momentum=0.9)
    ddp = DDP(model)

    def dies_now(step, in_save):
        return (first_life and dcomm.generation() == first_generation and step == a.kill_at_step
                and a.kill_in_save == in_save and dist.get_rank() == (0 if in_save else a.kill_rank))

    def step_fn(step):
        if dies_now(step, False):
            os.kill(os.getpid(), signal.SIGKILL)
        rank, world = dist.get_rank(), dist.get_world_size()
        x, y = batch(step)
        lo, hi = rank * GLOBAL_BATCH // world, (rank + 1) * GLOBAL_BATCH // world
        opt.zero_grad()
        # mean over the local shard, scaled so that DDP's average over ranks is the global mean
        loss = torch.nn.functional.mse_loss(ddp(x[lo:hi]), y[lo:hi], reduction="sum") * world / GLOBAL_BATCH
        loss.backward()
        opt.step()

    def get_state():
        if dies_now(done_steps[0], True):
            os.kill(os.getpid(), signal.SIGKILL)
        return {"model": model.state_dict(), "opt": opt.state_dict()}

    done_steps = [0]

    def counted(step):
        step_fn(step)
        done_steps[0] = step + 1

    def set_state(state):
        if state is None:
            model.load_state_dict(make_model().state_dict())
            opt.load_state_dict(torch.optim.SGD(model.parameters(), lr=a.lr, momentum=0.9).state_dict())
        else:
            model.load_state_dict(state["model"])
            opt.load_state_dict(state["opt"])

    def on_change(old, new):
        nonlocal ddp
        ddp = DDP(model)  # DDP holds the old group: wrap again at the new size
        if new[0] == 0:
            print(f"world {old[1]} -> {new[1]} (generation {dcomm.generation()})", flush=True)

    step = dcomm.torch.elastic_run(counted, a.steps, a.checkpoint_dir, a.checkpoint_every, get_state, set_state,
                                   on_change)
    if dist.get_rank() == 0:
        print(f"final step={step} world={dist.get_world_size()} generation={dcomm.generation()} "
              f"loss={full_loss(model):.12g}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
