"""_rendezvous.py: the torch rendezvous scheme "dcomm://".

    dist.init_process_group("dcomm", init_method="dcomm://")

dcomm finds the job itself (dcomm-run with or without etcd, srun, mpirun,
the torchrun variables) and gives torch its rank and world size; for
torch's own store, rank 0 of the current generation starts a TCPStore on a
free port and broadcasts its address over dcomm. Each generation gets a
fresh store, so the same call re-creates the default group after a
recovery, whichever ranks died (rank 0 included).
"""
import ctypes
from datetime import timedelta

from torch.distributed import PrefixStore, TCPStore, register_rendezvous_handler

from .. import _api as A
from .._errors import check
from .._lib import lib
from ._process_group import _store_host

_ADDR_BYTES = 256


def _broadcast_text(text):
    """Rank 0's text on every rank (at most 255 bytes)."""
    buf = ctypes.create_string_buffer(_ADDR_BYTES)
    if text is not None:
        buf.value = text.encode()
    if A.backend_name() != "nccl":
        A.broadcast(buf, 0)
        return buf.value.decode()
    import torch  # the nccl backend takes device memory only: stage through the GPU
    t = torch.frombuffer(bytearray(buf.raw), dtype=torch.uint8).cuda()
    check(lib.dcomm_broadcast(t.data_ptr(), _ADDR_BYTES, 1, 0, None))  # 1: DCOMM_UINT8
    return bytes(t.cpu().tolist()).rstrip(b"\0").decode()


def dcomm_store(timeout=timedelta(minutes=5)):
    """(store, rank, world_size): a torch store for this dcomm generation, shared by every rank."""
    if not A.is_initialized():
        A.init()
    rank, size = A.rank(), A.world_size()
    master = None
    if rank == 0:
        host = _store_host()
        master = TCPStore(host, 0, size, True, timeout, wait_for_workers=False)
        addr = f"{host}:{master.port}"
    else:
        addr = None
    addr = _broadcast_text(addr)
    if rank == 0:
        store = master
    else:
        host, port = addr.rsplit(":", 1)
        store = TCPStore(host, int(port), size, False, timeout)
    return PrefixStore(f"dcomm/g{A.generation() if A.elastic_enabled() else 0}", store), rank, size


def _handler(url, timeout=timedelta(minutes=5), **kwargs):
    store, rank, size = dcomm_store(timeout)
    yield store, rank, size


def register():
    try:
        register_rendezvous_handler("dcomm", _handler)
    except RuntimeError:
        pass  # registered already
