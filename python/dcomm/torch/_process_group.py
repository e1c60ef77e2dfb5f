"""_process_group.py: ProcessGroupDcomm, the torch.distributed backend "dcomm".

torch calls create() for the default group and for every dist.new_group,
on the group's members only. The default group is dcomm's world; a
sub-group is a dcomm group made on its members alone
(dcomm_new_group_named, keyed by torch's group name). Every method posts
its operation to the group's Executor and returns a Work at once, except
that an operation torch will wait for at once (async_op=False) runs on the
calling thread when the group is idle (_caller_waits, Executor.run_now).

dcomm itself is initialized by the first create(): with dcomm's own
launcher detection when a dcomm launcher started the process (dcomm-run,
srun, mpirun: DCOMM_INIT_METHOD or DCOMM_USE_AGENT_STORE), else through the
store torch hands us (torchrun, env://, file://, tcp:// of torch): rank 0
hosts dcomm's store on a free port and publishes it there.

With dcomm's nccl backend (DCOMM_BACKEND=nccl) tensors must be CUDA tensors
and each operation runs on torch's current stream of the calling thread.
"""
import os
import socket
import sys
import weakref
from datetime import timedelta

import torch
from torch._C._distributed_c10d import ProcessGroup

from .. import _api as A
from .._errors import Error, InvalidArgument, NotSupported
from . import _tensors as T
from ._work import Executor, check, lib

_GROUPS = weakref.WeakSet()  # every live ProcessGroupDcomm, for shutdown_all()
_DEFAULT_TORCH_TIMEOUT = timedelta(minutes=30)
_HERE = globals()


def _store_host():
    for var in ("DCOMM_SOCKET_IFADDR", "MASTER_ADDR"):
        v = os.environ.get(var)
        if v:
            return v
    try:
        return socket.gethostbyname(socket.getfqdn())
    except OSError:
        return "127.0.0.1"


def _free_port(host):
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def launched_by_dcomm():
    """True when a dcomm launcher (dcomm-run, or DCOMM_INIT_METHOD set by hand) set up this process."""
    return bool(os.environ.get("DCOMM_INIT_METHOD")) or os.environ.get("DCOMM_USE_AGENT_STORE") == "1"


def ensure_init(store, rank, size):
    """Initializes dcomm for a torch world of `size` where this process is `rank`, once."""
    if A.is_initialized():
        return
    backend = os.environ.get("DCOMM_BACKEND") or None
    if launched_by_dcomm() or store is None:
        A.init(backend)
        return
    key = "dcomm/store"
    if rank == 0:
        host = _store_host()
        port = _free_port(host)
        store.set(key, f"[{host}]:{port}" if ":" in host else f"{host}:{port}")
    addr = store.get(key).decode()
    A.init(backend, f"tcp://{addr}?rank={rank}&world_size={size}")


def _timeout_seconds(timeout):
    """torch's group timeout, unless it is torch's 30-minute default (then dcomm's DCOMM_TIMEOUT holds)."""
    if timeout is None or timeout == _DEFAULT_TORCH_TIMEOUT:
        return None
    return timeout.total_seconds()


def _opt(opts, name, default):
    return getattr(opts, name, default) if opts is not None else default


def _caller_waits():
    """True when the operation being posted comes from a torch.distributed call made with
    async_op=False (dist.all_reduce(t), dist.barrier(), ...): torch then waits for the Work right
    after it is returned, so the operation may as well run now, on this thread. Read from the first
    Python frame outside this module: C++ (DDP's reducer, a comm hook) or a call with async_op=True
    gets the executor, and so does any torch whose front end this does not recognise."""
    f = sys._getframe(2)
    while f is not None and f.f_globals is _HERE:
        f = f.f_back
    if f is None or f.f_globals.get("__name__") != "torch.distributed.distributed_c10d":
        return False
    return f.f_locals.get("async_op", True) is False


def _list(x):
    return [x] if isinstance(x, torch.Tensor) else list(x)


class ProcessGroupDcomm(ProcessGroup):
    """A torch ProcessGroup over one dcomm group (None: dcomm's world)."""

    def __init__(self, rank, size, group, timeout_s, label):
        super().__init__(rank, size)
        self._group = group
        self._label = label
        self._on_gpu = A.backend_name() == "nccl"
        if timeout_s is not None:
            check(lib.dcomm_group_set_timeout(group, float(timeout_s)))
        exec_timeout = timeout_s or float(os.environ.get("DCOMM_TIMEOUT", "300"))
        self._exec = Executor(group, label, exec_timeout)
        self._closed = False
        _GROUPS.add(self)

    # ---- plumbing ----

    def getBackendName(self):
        return "dcomm"

    def name(self):
        return "dcomm"

    def _post(self, what, outputs, inputs, fn):
        T.check_device(inputs if outputs is inputs else inputs + outputs, self._on_gpu)
        if self._on_gpu:
            stream = torch.cuda.current_stream().cuda_stream
            inner = fn

            def fn():
                check(lib.dcomm_set_stream(self._group, stream))
                inner()
        if _caller_waits():
            w = self._exec.run_now(fn, outputs, what)
            if w is not None:
                return w
        return self._exec.submit(fn, outputs, what)

    def shutdown(self, why="the process group was destroyed", timeout=None):
        """Stops the executor (what was not started fails) and frees the dcomm sub-group."""
        if self._closed:
            return True
        self._closed = True
        stopped = self._exec.stop(why, timeout)
        if stopped and self._group is not None and A.is_initialized():
            try:
                self._group.free()
            except Error:
                pass  # freed by a finalize already
        return stopped

    # ---- reductions ----

    def _reduce_into(self, t, op, root):
        """All-reduce (root None) or reduce of tensor t in place."""
        dt, dop, widen = T.reduction(t, op)
        o = T.Out(t, widen)
        addr, count, _ = T.raw(o.c)
        if root is None:
            check(lib.dcomm_all_reduce(addr, count, dt, dop, self._group))
        else:
            check(lib.dcomm_reduce(addr, count, dt, dop, root, self._group))
        if root is None or root == self.rank():
            o.done()

    def allreduce(self, tensors, opts=None):
        tensors = _list(tensors)
        op = opts if not hasattr(opts, "reduceOp") and opts is not None else _opt(opts, "reduceOp", None)

        def run():
            if len(tensors) == 1:
                return self._reduce_into(tensors[0], op, None)
            self._reduce_list(tensors, op)
        return self._post("allreduce", tensors, tensors, run)

    def _reduce_list(self, tensors, op):
        """Several tensors of one process: reduce locally, all-reduce once, copy to each."""
        acc = tensors[0].clone()
        name = T.op_name(op)
        for t in tensors[1:]:
            if name in ("SUM", "AVG"):
                acc += t
            elif name == "PRODUCT":
                acc *= t
            elif name == "MIN":
                acc = torch.minimum(acc, t)
            elif name == "MAX":
                acc = torch.maximum(acc, t)
            else:
                raise NotSupported(-7, f"ReduceOp.{name} over several tensors per process")
        self._reduce_into(acc, op, None)
        if name == "AVG":
            acc /= len(tensors)
        for t in tensors:
            t.copy_(acc)

    def allreduce_coalesced(self, tensors, opts=None):
        tensors = _list(tensors)
        op = _opt(opts, "reduceOp", None)
        if len({t.dtype for t in tensors}) > 1:
            raise InvalidArgument(-1, "allreduce_coalesced: every tensor must have the same dtype")

        def run():
            flat = torch.cat([t.reshape(-1) for t in tensors])
            self._reduce_into(flat, op, None)
            at = 0
            for t in tensors:
                n = t.numel()
                t.copy_(flat[at:at + n].view_as(t))
                at += n
        return self._post("allreduce_coalesced", tensors, tensors, run)

    def reduce(self, tensors, opts=None):
        tensors = _list(tensors)
        root, op = _opt(opts, "rootRank", 0), _opt(opts, "reduceOp", None)
        return self._post("reduce", tensors, tensors, lambda: self._reduce_into(tensors[0], op, root))

    # ---- data movement ----

    def broadcast(self, tensors, opts=None):
        tensors = _list(tensors)
        root = _opt(opts, "rootRank", 0)

        def run():
            o = T.Out(tensors[0])
            addr, count, dt = T.raw(o.c)
            check(lib.dcomm_broadcast(addr, count, dt, root, self._group))
            o.done()
        return self._post("broadcast", tensors, tensors, run)

    def _all_gather_flat(self, out_flat, inp):
        a_out, _, _ = T.raw(out_flat)
        a_in, count, dt = T.raw(inp)
        check(lib.dcomm_all_gather(a_in, a_out, count, dt, self._group))

    def allgather(self, output_tensors, input_tensors, opts=None):
        outs, inp = output_tensors[0], _list(input_tensors)[0]
        n = self.size()
        if len(outs) != n:
            raise InvalidArgument(-1, f"allgather: {len(outs)} output tensors for a group of {n}")

        def run():
            src = T.contiguous(inp)
            if all(o.numel() == src.numel() and o.dtype == src.dtype for o in outs):
                flat = torch.empty((n * src.numel(),), dtype=src.dtype, device=src.device)
                self._all_gather_flat(flat, src)
                for i, o in enumerate(outs):
                    o.copy_(flat[i * src.numel():(i + 1) * src.numel()].view_as(o))
                return
            for i, o in enumerate(outs):  # uneven sizes: one broadcast per rank
                buf = T.Out(o)
                if i == self.rank():
                    buf.c.copy_(src.view_as(buf.c))
                addr, count, dt = T.raw(buf.c)
                check(lib.dcomm_broadcast(addr, count, dt, i, self._group))
                buf.done()
        return self._post("allgather", outs, [inp], run)

    def _allgather_base(self, output, input, opts=None):
        if output.numel() != input.numel() * self.size():
            raise InvalidArgument(-1, f"_allgather_base: output has {output.numel()} elements, needs "
                                      f"{self.size()} x {input.numel()}")

        def run():
            o = T.Out(output)
            self._all_gather_flat(o.c, T.contiguous(input))
            o.done()
        return self._post("_allgather_base", [output], [input], run)

    def allgather_coalesced(self, output_lists, input_list, opts=None):
        inputs = _list(input_list)
        n = self.size()

        def run():
            flat_in = torch.cat([t.reshape(-1) for t in inputs])
            flat_out = torch.empty((n * flat_in.numel(),), dtype=flat_in.dtype, device=flat_in.device)
            self._all_gather_flat(flat_out, flat_in)
            per = flat_in.numel()
            for r in range(n):
                at = r * per
                for t in output_lists[r]:
                    t.copy_(flat_out[at:at + t.numel()].view_as(t))
                    at += t.numel()
        outs = [t for lst in output_lists for t in lst]
        return self._post("allgather_coalesced", outs, inputs, run)

    def gather(self, output_tensors, input_tensors, opts=None):
        root = _opt(opts, "rootRank", 0)
        inp = _list(input_tensors)[0]
        outs = output_tensors[0] if self.rank() == root else []

        def run():
            src = T.contiguous(inp)
            flat = None
            if self.rank() == root:
                flat = torch.empty((self.size() * src.numel(),), dtype=src.dtype, device=src.device)
            a_in, count, dt = T.raw(src)
            check(lib.dcomm_gather(a_in, T.raw(flat)[0] if flat is not None else None, count, dt, root,
                                   self._group))
            for i, o in enumerate(outs):
                o.copy_(flat[i * src.numel():(i + 1) * src.numel()].view_as(o))
        return self._post("gather", list(outs), [inp], run)

    def scatter(self, output_tensors, input_tensors, opts=None):
        root = _opt(opts, "rootRank", 0)
        out = _list(output_tensors)[0]
        ins = input_tensors[0] if self.rank() == root and input_tensors else []

        def run():
            o = T.Out(out)
            flat = torch.cat([T.contiguous(t).reshape(-1) for t in ins]) if self.rank() == root else None
            a_out, count, dt = T.raw(o.c)
            check(lib.dcomm_scatter(T.raw(flat)[0] if flat is not None else None, a_out, count, dt, root,
                                    self._group))
            o.done()
        return self._post("scatter", [out], list(ins), run)

    def _reduce_scatter_flat(self, out, flat_in, op):
        dt, dop, widen = T.reduction(out, op)
        o = T.Out(out, widen)
        src = flat_in.to(widen) if widen is not None else T.contiguous(flat_in)
        check(lib.dcomm_reduce_scatter(T.raw(src)[0], T.raw(o.c)[0], T.raw(o.c)[1], dt, dop, self._group))
        o.done()

    def reduce_scatter(self, output_tensors, input_tensors, opts=None):
        out, ins = _list(output_tensors)[0], input_tensors[0]
        op = _opt(opts, "reduceOp", None)
        if len(ins) != self.size() or any(t.numel() != out.numel() for t in ins):
            raise InvalidArgument(-1, "reduce_scatter: needs one input per rank, each the output's size")
        return self._post("reduce_scatter", [out], list(ins), lambda: self._reduce_scatter_flat(
            out, torch.cat([t.reshape(-1) for t in ins]), op))

    def _reduce_scatter_base(self, output, input, opts=None):
        op = _opt(opts, "reduceOp", None)
        if input.numel() != output.numel() * self.size():
            raise InvalidArgument(-1, f"_reduce_scatter_base: input has {input.numel()} elements, needs "
                                      f"{self.size()} x {output.numel()}")
        return self._post("_reduce_scatter_base", [output], [input],
                          lambda: self._reduce_scatter_flat(output, input.reshape(-1), op))

    def _all_to_allv(self, out_flat, in_flat, sendcounts, recvcounts):
        a_in, _, dt = T.raw(in_flat)
        a_out, _, _ = T.raw(out_flat)
        scale = T.units(in_flat)
        sc = [c * scale for c in sendcounts]
        rc = [c * scale for c in recvcounts]
        n = len(sc)
        arr = A.ctypes.c_size_t * n
        sd, rd = A._displs(sc), A._displs(rc)
        check(lib.dcomm_all_to_allv(a_in, arr(*sc), arr(*sd), a_out, arr(*rc), arr(*rd), dt, self._group))

    def alltoall_base(self, output, input, output_split_sizes, input_split_sizes, opts=None):
        n = self.size()

        def splits(t, sizes, what):
            if not sizes:
                if t.shape[0] % n if t.dim() else t.numel() % n:
                    raise InvalidArgument(-1, f"alltoall_base: {what} dim 0 is not divisible by {n}")
                return [t.numel() // n] * n
            if len(sizes) != n or sum(sizes) != (t.shape[0] if t.dim() else 1):
                raise InvalidArgument(-1, f"alltoall_base: {what} split sizes {list(sizes)} do not fit "
                                          f"{tuple(t.shape)} in a group of {n}")
            row = t.numel() // max(t.shape[0], 1) if t.dim() else 1
            return [s * row for s in sizes]
        sendcounts = splits(input, input_split_sizes, "input")
        recvcounts = splits(output, output_split_sizes, "output")
        if output.dtype != input.dtype:
            raise InvalidArgument(-1, "alltoall_base: input and output dtypes differ")

        def run():
            o = T.Out(output)
            src = T.contiguous(input)
            if len(set(sendcounts)) == 1 and sendcounts == recvcounts:
                a_in, count, dt = T.raw(src)
                check(lib.dcomm_all_to_all(a_in, T.raw(o.c)[0], count // n, dt, self._group))
            else:
                self._all_to_allv(o.c, src, sendcounts, recvcounts)
            o.done()
        return self._post("alltoall_base", [output], [input], run)

    def alltoall(self, output_tensors, input_tensors, opts=None):
        outs, ins = list(output_tensors), list(input_tensors)
        if len(outs) != self.size() or len(ins) != self.size():
            raise InvalidArgument(-1, f"alltoall: needs {self.size()} input and output tensors")
        if len({t.dtype for t in outs + ins}) > 1:
            raise InvalidArgument(-1, "alltoall: every tensor must have the same dtype")

        def run():
            src = torch.cat([t.reshape(-1) for t in ins])
            dst = torch.empty((sum(t.numel() for t in outs),), dtype=src.dtype, device=src.device)
            self._all_to_allv(dst, src, [t.numel() for t in ins], [t.numel() for t in outs])
            at = 0
            for t in outs:
                t.copy_(dst[at:at + t.numel()].view_as(t))
                at += t.numel()
        return self._post("alltoall", outs, ins, run)

    # ---- synchronization ----

    def barrier(self, opts=None):
        return self._post("barrier", [], [], lambda: check(lib.dcomm_barrier(self._group)))

    def monitored_barrier(self, timeout=None, wait_all_ranks=False):
        """A barrier bounded by timeout; the error names the rank that did not arrive."""
        secs = timeout.total_seconds() if hasattr(timeout, "total_seconds") else timeout

        def run():
            g = self._group
            if secs:
                check(lib.dcomm_group_set_timeout(g, float(secs)))
            try:
                check(lib.dcomm_barrier(g))
            finally:
                if secs:
                    check(lib.dcomm_group_set_timeout(g, float(self._exec.timeout_s)))
        self._post("monitored_barrier", [], [], run).wait()

    # ---- point to point ----

    def send(self, tensors, dst_rank, tag=0):
        t = T.contiguous(_list(tensors)[0])
        addr, count, dt = T.raw(t)
        return self._post("send", [t], [t], lambda: check(lib.dcomm_send(addr, count, dt, dst_rank, tag,
                                                                           self._group)))

    def _recv(self, tensors, src, tag, what):
        t = _list(tensors)[0]
        T.check_device([t], self._on_gpu)
        o = T.Out(t)
        addr, count, dt = T.raw(o.c)
        stream = torch.cuda.current_stream().cuda_stream if self._on_gpu else None

        def run(peer):
            if stream is not None:  # on the caller's stream, as _post does for the other operations
                check(lib.dcomm_set_stream(self._group, stream))
            check(lib.dcomm_recv(addr, count, dt, peer, tag, self._group))
            o.done()
        return self._exec.submit_recv(src, tag, run, [t], what)

    def recv(self, tensors, src_rank, tag=0):
        return self._recv(tensors, src_rank, tag, "recv")

    def recv_anysource(self, tensors, tag=0):
        return self._recv(tensors, A.ANY_SOURCE, tag, "recv_anysource")


def create(opts, pg_options=None):
    """The creator torch calls (extended API) on the members of every new dcomm process group."""
    store, rank, size = opts.store, opts.group_rank, opts.group_size
    granks = list(opts.global_ranks_in_group)
    if not granks:  # the default group: dcomm's world
        ensure_init(store, rank, size)
        if A.world_size() != size or A.rank() != rank:
            raise InvalidArgument(-1, f"torch's world (rank {rank} of {size}) differs from dcomm's (rank "
                                      f"{A.rank()} of {A.world_size()}): after a recovery, initialize with "
                                      "init_method='dcomm://' (or rank=dcomm.rank(), world_size=dcomm.world_size())")
        pg = ProcessGroupDcomm(rank, size, None, _timeout_seconds(opts.timeout), "world")
        return pg
    if not A.is_initialized():
        raise InvalidArgument(-1, "a dcomm sub-group needs the default group on dcomm first")
    name = f"torch/{opts.group_id or ','.join(map(str, granks))}"
    group = A.new_group(granks, name=name)
    return ProcessGroupDcomm(rank, size, group, _timeout_seconds(opts.timeout), name)


def shutdown_all(why="the process groups were destroyed", timeout=None):
    """Stops every dcomm process group's executor and frees their dcomm sub-groups; True when all stopped."""
    ok = True
    for pg in list(_GROUPS):
        ok = pg.shutdown(why, timeout) and ok
    return ok
