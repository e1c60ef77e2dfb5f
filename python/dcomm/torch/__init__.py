"""dcomm.torch: the torch.distributed backend "dcomm".

    import torch.distributed as dist
    import dcomm.torch                       # registers the backend
    dist.init_process_group("dcomm")         # under torchrun, or dcomm-run
    dist.init_process_group("dcomm", init_method="dcomm://")   # any dcomm launcher

Every collective, point-to-point call and sub-group of torch.distributed
runs on libdcomm (CPU tensors: dcomm's tcp backend over shared memory and
TCP; CUDA tensors: DCOMM_BACKEND=nccl). elastic.py adds in-process
recovery: recover(), elastic_run() and the checkpoint helpers. See
dcomm_torch(7).
"""
import atexit as _atexit

import torch.distributed as _dist

from . import _process_group, _rendezvous
from .elastic import elastic_run, is_recoverable, load_checkpoint, recover, save_checkpoint  # noqa: F401
from ._process_group import ProcessGroupDcomm, shutdown_all  # noqa: F401
from ._rendezvous import dcomm_store  # noqa: F401
from ._work import Work  # noqa: F401

BACKEND = "dcomm"


def _at_exit():
    """Stops the executors before the interpreter tears torch down (its C++ objects must go first)."""
    try:
        if _dist.is_initialized() and _dist.get_backend() == BACKEND:
            _dist.destroy_process_group()
    except Exception:  # noqa: BLE001 - best effort at exit
        pass
    shutdown_all("the interpreter is exiting", 5.0)


def _register():
    if "DCOMM" not in _dist.Backend._plugins:
        _dist.Backend.register_backend(BACKEND, _process_group.create, extended_api=True)
    _rendezvous.register()
    _atexit.register(_at_exit)


_register()
