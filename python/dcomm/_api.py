"""_api.py: the library's calls for Python: set-up, groups, collectives on
buffers, point-to-point, elastic recovery and checkpoints.

Each function mirrors its C call (man dcomm_<name>) and raises a dcomm.Error
subclass instead of returning a code. Buffers are anything with the buffer
protocol (see _buffers.py); `group` is a Group or None for the world. The
ctypes calls release the GIL, so other Python threads run while a
collective waits.
"""
import ctypes

from ._buffers import Buffer
from ._errors import InvalidArgument, NotFound, check
from ._lib import has, lib

# dcomm_op_t values.
SUM, PROD, MAX, MIN, AVG, BAND, BOR, BXOR = range(8)
ANY_SOURCE = -1


def _b(s):
    return None if s is None else s.encode()


def init(backend=None, init_method=None):
    """dcomm_init: backend None reads DCOMM_BACKEND (default "tcp"); init_method None detects the launcher."""
    check(lib.dcomm_init(_b(backend), _b(init_method)))


def finalize():
    """dcomm_finalize: releases every group and the world."""
    check(lib.dcomm_finalize())


def is_initialized():
    return bool(lib.dcomm_initialized())


def rank():
    return check(lib.dcomm_rank())


def world_size():
    return check(lib.dcomm_world_size())


def local_rank():
    return check(lib.dcomm_local_rank())


def local_world_size():
    return check(lib.dcomm_local_world_size())


def backend_name():
    name = lib.dcomm_backend_name()
    return name.decode() if name else None


def version():
    return lib.dcomm_version_string().decode()


class Group:
    """A dcomm process group (dcomm_group_t). Non-members hold a handle too: rank is then -1."""

    __slots__ = ("_as_parameter_", "_freed")

    def __init__(self, handle):
        self._as_parameter_ = ctypes.c_void_p(handle)
        self._freed = False

    @property
    def rank(self):
        """This process's rank in the group, -1 when it is not a member."""
        rc = lib.dcomm_group_rank(self)
        return -1 if rc == -12 else check(rc)

    @property
    def size(self):
        return check(lib.dcomm_group_size(self))

    def world_rank(self, group_rank):
        return check(lib.dcomm_group_world_rank(self, group_rank))

    def set_timeout(self, seconds):
        check(lib.dcomm_group_set_timeout(self, float(seconds)))

    def free(self):
        """dcomm_group_free; the handle is dead afterwards."""
        if not self._freed:
            self._freed = True
            check(lib.dcomm_group_free(self))


def _ranks_array(ranks):
    ranks = [int(r) for r in ranks]
    return (ctypes.c_int * max(len(ranks), 1))(*ranks), len(ranks)


def new_group(ranks, name=None):
    """dcomm_new_group (collective over the world), or with a name dcomm_new_group_named
    (collective over the members only)."""
    arr, n = _ranks_array(ranks)
    out = ctypes.c_void_p()
    if name is None:
        check(lib.dcomm_new_group(arr, n, ctypes.byref(out)))
    else:
        check(lib.dcomm_new_group_named(name.encode(), arr, n, ctypes.byref(out)))
    return Group(out.value)


def group_split(parent, color, key):
    """dcomm_group_split: collective over parent; a negative color gives a non-member handle."""
    out = ctypes.c_void_p()
    check(lib.dcomm_group_split(parent, int(color), int(key), ctypes.byref(out)))
    return Group(out.value)


def _inout(buf, what, dtype):
    return Buffer(buf, what, True, dtype)


def _in(buf, what, dtype):
    return Buffer(buf, what, False, dtype)


def _same(a, b, what):
    if a.dtype != b.dtype:
        raise InvalidArgument(-1, f"{what}: input and output have different dtypes")


def all_reduce(buf, op=SUM, group=None, dtype=None):
    b = _inout(buf, "all_reduce", dtype)
    check(lib.dcomm_all_reduce(b.addr, b.count, b.dtype, op, group))


def reduce(buf, root, op=SUM, group=None, dtype=None):
    b = _inout(buf, "reduce", dtype)
    check(lib.dcomm_reduce(b.addr, b.count, b.dtype, op, root, group))


def broadcast(buf, root, group=None, dtype=None):
    b = _inout(buf, "broadcast", dtype)
    check(lib.dcomm_broadcast(b.addr, b.count, b.dtype, root, group))


def _per_rank(send, recv, group, what, dtype, recv_is_bigger=True):
    s, r = _in(send, f"{what} input", dtype), _inout(recv, f"{what} output", dtype)
    _same(s, r, what)
    n = group.size if group is not None else world_size()
    return s, r, n


def all_gather(send, recv, group=None, dtype=None):
    s, r, n = _per_rank(send, recv, group, "all_gather", dtype)
    if r.count != s.count * n:
        raise InvalidArgument(-1, f"all_gather: output has {r.count} elements, needs {n} x {s.count}")
    check(lib.dcomm_all_gather(s.addr, r.addr, s.count, s.dtype, group))


def gather(send, recv, root, group=None, dtype=None):
    """recv is used on root only (others may pass None)."""
    s = _in(send, "gather input", dtype)
    r = _inout(recv, "gather output", dtype) if recv is not None else None
    check(lib.dcomm_gather(s.addr, r.addr if r else None, s.count, s.dtype, root, group))


def scatter(send, recv, root, group=None, dtype=None):
    """send is used on root only (others may pass None)."""
    r = _inout(recv, "scatter output", dtype)
    s = _in(send, "scatter input", dtype) if send is not None else None
    check(lib.dcomm_scatter(s.addr if s else None, r.addr, r.count, r.dtype, root, group))


def reduce_scatter(send, recv, op=SUM, group=None, dtype=None):
    s, r, n = _per_rank(send, recv, group, "reduce_scatter", dtype)
    if s.count != r.count * n:
        raise InvalidArgument(-1, f"reduce_scatter: input has {s.count} elements, needs {n} x {r.count}")
    check(lib.dcomm_reduce_scatter(s.addr, r.addr, r.count, r.dtype, op, group))


def all_to_all(send, recv, group=None, dtype=None):
    s, r, n = _per_rank(send, recv, group, "all_to_all", dtype)
    if s.count != r.count or s.count % n:
        raise InvalidArgument(-1, f"all_to_all: input and output need the same size, a multiple of {n} elements")
    check(lib.dcomm_all_to_all(s.addr, r.addr, s.count // n, s.dtype, group))


def _displs(counts):
    out, at = [], 0
    for c in counts:
        out.append(at)
        at += c
    return out


def all_to_allv(send, sendcounts, recv, recvcounts, sdispls=None, rdispls=None, group=None, dtype=None):
    """dcomm_all_to_allv: counts and displacements in elements, one per group rank
    (displacements default to the packed layout)."""
    s, r = _in(send, "all_to_allv input", dtype), _inout(recv, "all_to_allv output", dtype)
    _same(s, r, "all_to_allv")
    sdispls = _displs(sendcounts) if sdispls is None else sdispls
    rdispls = _displs(recvcounts) if rdispls is None else rdispls
    n = len(sendcounts)
    if not (len(recvcounts) == len(sdispls) == len(rdispls) == n):
        raise InvalidArgument(-1, "all_to_allv: counts and displacements need one entry per group rank")
    arr = ctypes.c_size_t * max(n, 1)
    check(lib.dcomm_all_to_allv(s.addr, arr(*sendcounts), arr(*sdispls), r.addr, arr(*recvcounts), arr(*rdispls),
                                s.dtype, group))


def send(buf, peer, tag=0, group=None, dtype=None):
    b = _in(buf, "send", dtype)
    check(lib.dcomm_send(b.addr, b.count, b.dtype, peer, tag, group))


def recv(buf, peer=ANY_SOURCE, tag=0, group=None, dtype=None):
    """Receives into buf from peer (ANY_SOURCE: any member); returns the sender's group rank."""
    b = _inout(buf, "recv", dtype)
    if peer is None or peer == ANY_SOURCE:
        src = ctypes.c_int(-1)
        check(lib.dcomm_recv_any(b.addr, b.count, b.dtype, tag, group, ctypes.byref(src)))
        return src.value
    check(lib.dcomm_recv(b.addr, b.count, b.dtype, peer, tag, group))
    return peer


def probe(peer=ANY_SOURCE, tag=0, group=None, timeout=0.0):
    """dcomm_probe: (source, nbytes) of a waiting message with tag from peer, or None if none came within timeout."""
    src, nbytes = ctypes.c_int(-1), ctypes.c_size_t(0)
    rc = check(lib.dcomm_probe(ANY_SOURCE if peer is None else peer, tag, group, float(timeout), ctypes.byref(src),
                               ctypes.byref(nbytes)))
    return (src.value, nbytes.value) if rc == 1 else None


def barrier(group=None):
    check(lib.dcomm_barrier(group))


def set_stream(group, cuda_stream):
    """dcomm_set_stream: later collectives of this rank on group run on cuda_stream (an int handle, 0/None: reset)."""
    check(lib.dcomm_set_stream(group, ctypes.c_void_p(cuda_stream or None)))


# ---- elastic ----

def generation():
    return check(lib.dcomm_generation())


def is_joiner():
    return bool(lib.dcomm_elastic_is_joiner())


def elastic_enabled():
    return bool(lib.dcomm_elastic_enabled())


def member_id():
    m = lib.dcomm_member_id()
    return m.decode() if m else None


def recoverable(err):
    """True for an Error (or code) that recover() can repair."""
    code = getattr(err, "code", err)
    return isinstance(code, int) and bool(lib.dcomm_elastic_recoverable(code))


def recover():
    """dcomm_elastic_recover: collective over the survivors; rank and world size may change."""
    check(lib.dcomm_elastic_recover())


def checkpoint_save(directory, step, data):
    """dcomm_checkpoint_save: collective; rank 0's data (bytes-like) is committed, others may pass None."""
    if data is None:
        check(lib.dcomm_checkpoint_save(directory.encode(), step, None, 0))
        return
    b = Buffer(data, "checkpoint_save", False, "uint8")
    check(lib.dcomm_checkpoint_save(directory.encode(), step, b.addr, b.nbytes))


def checkpoint_load(directory):
    """dcomm_checkpoint_load: collective; (step, bytes) of the last committed checkpoint, or None when there is none."""
    ptr, length, step = ctypes.c_void_p(), ctypes.c_size_t(0), ctypes.c_uint64(0)
    try:
        check(lib.dcomm_checkpoint_load(directory.encode(), ctypes.byref(ptr), ctypes.byref(length),
                                        ctypes.byref(step)))
    except NotFound:
        return None
    try:
        data = ctypes.string_at(ptr.value, length.value) if length.value else b""
    finally:
        lib.free(ptr.value)
    return step.value, data


__all__ = [n for n in dir() if not n.startswith("_") and n not in ("ctypes", "lib", "has", "check", "Buffer")]
