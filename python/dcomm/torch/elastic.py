"""elastic.py: in-process recovery for PyTorch programs on the dcomm backend.

When a rank dies, the survivors' collectives fail (a dcomm.Error, or a
RuntimeError naming DCOMM_EPEERLOST / DCOMM_EREVOKED / DCOMM_ETIMEDOUT when
the failure came through DDP's C++ reducer). Then:

    if dcomm.torch.is_recoverable(err):
        dcomm.torch.recover()          # survivors agree on the next world
        # re-create sub-groups, DDP and the optimizer at the new size, then
        step, state = dcomm.torch.load_checkpoint(ckpt_dir)

elastic_run() is that loop for a step function, in the spirit of
dcomm_elastic_run(3). Checkpoints are dcomm's: written by rank 0 between two
barriers, committed atomically, and read back by every rank.
"""
import io
import re

import torch
import torch.distributed as dist

from .. import _api as A
from .._errors import Error
from .._lib import has, lib
from . import _process_group as P

_RECOVERABLE = re.compile(r"DCOMM_E(PEERLOST|REVOKED|TIMEDOUT)")


def is_recoverable(err):
    """True when err is a failure recover() can repair."""
    if isinstance(err, Error):
        return A.recoverable(err)
    return isinstance(err, RuntimeError) and bool(_RECOVERABLE.search(str(err)))


def recover(timeout=60.0):
    """Rebuilds the job from the survivors (and joiners) after a recoverable failure.

    Revokes the failed generation (every rank's calls in progress end), stops
    every dcomm process group, runs dcomm_elastic_recover(), and re-creates
    torch's default group with init_method="dcomm://". Returns (rank,
    world_size) of the new world. Sub-groups, DDP wrappers and anything else
    that holds a process group must be made again.
    """
    if has("dcomm_elastic_revoke"):
        lib.dcomm_elastic_revoke()  # may fail if the store is gone too: recover() reports it
    P.shutdown_all("recovering from a failure", timeout)
    if dist.is_initialized():
        dist.destroy_process_group()
    A.recover()
    dist.init_process_group("dcomm", init_method="dcomm://")
    return dist.get_rank(), dist.get_world_size()


def save_checkpoint(directory, step, state):
    """Collective: rank 0's state (anything torch.save takes) is committed as step; others may pass None."""
    data = None
    if A.rank() == 0:
        buf = io.BytesIO()
        torch.save(state, buf)
        data = buf.getbuffer()
    A.checkpoint_save(directory, step, data)


def load_checkpoint(directory, map_location="cpu"):
    """Collective: (step, state) of the last committed checkpoint, or (0, None) when there is none."""
    got = A.checkpoint_load(directory)
    if got is None:
        return 0, None
    step, data = got
    return step, torch.load(io.BytesIO(data), map_location=map_location)


def elastic_run(step_fn, total_steps, checkpoint_dir, checkpoint_every, get_state, set_state,
                on_membership_change=None):
    """Runs step_fn(step) for steps [start, total_steps), surviving lost ranks.

    get_state() (called on rank 0 at each checkpoint) returns what to save;
    set_state(state) restores it on every rank (None: no checkpoint yet,
    start from the initial state). After a recovery on_membership_change(old,
    new) is called with (rank, world_size) pairs so that the program can
    rebuild DDP, sub-groups and its data split, then the last checkpoint is
    loaded and the loop goes on from its step. Returns the final step.
    """
    step, state = load_checkpoint(checkpoint_dir)
    set_state(state)
    while step < total_steps:
        try:
            step_fn(step)
            step += 1
            if checkpoint_every and step % checkpoint_every == 0:
                save_checkpoint(checkpoint_dir, step, get_state() if A.rank() == 0 else None)
        except Exception as err:  # noqa: BLE001 - only recoverable failures are handled
            if not is_recoverable(err):
                raise
            old = (A.rank(), A.world_size())
            new = recover()
            if on_membership_change is not None:
                on_membership_change(old, new)
            step, state = load_checkpoint(checkpoint_dir)
            set_state(state)
    return step
