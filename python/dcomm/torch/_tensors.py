"""_tensors.py: torch tensors as dcomm buffers.

raw(t) gives (address, element count, dcomm dtype) of a contiguous tensor
for an operation that only moves bytes: complex tensors travel as their
real pairs, and dtypes dcomm has no type for (bool, int16, ...) as bytes.
reduction(t, op) gives the dtype and dcomm op for a reduction, or says
which wider dtype the tensor must be reduced in. Non-contiguous outputs are
written through a contiguous copy (Out).
"""
import torch
from torch.distributed import ReduceOp

from .. import _api as A
from .. import _buffers as B
from .._errors import InvalidArgument, NotSupported

_DTYPES = {torch.float32: B.FLOAT32, torch.float64: B.FLOAT64, torch.float16: B.FLOAT16,
           torch.bfloat16: B.BFLOAT16, torch.int8: B.INT8, torch.uint8: B.UINT8, torch.int32: B.INT32,
           torch.int64: B.INT64}
_COMPLEX = {torch.complex64: B.FLOAT32, torch.complex128: B.FLOAT64}
_OPS = {"SUM": A.SUM, "PRODUCT": A.PROD, "MIN": A.MIN, "MAX": A.MAX, "AVG": A.AVG, "BAND": A.BAND,
        "BOR": A.BOR, "BXOR": A.BXOR}
# bool reduces as uint8 0/1: sum and max are "or", product and min "and".
_BOOL_OPS = {"SUM": A.MAX, "MAX": A.MAX, "BOR": A.BOR, "PRODUCT": A.MIN, "MIN": A.MIN, "BAND": A.BAND,
             "BXOR": A.BXOR}
# integer dtypes without a dcomm type reduce in int64 and are cast back.
_WIDEN = {torch.int16: torch.int64}


def raw(t):
    """(addr, count, dtype) of contiguous tensor t for byte-moving operations."""
    dt = _DTYPES.get(t.dtype)
    if dt is not None:
        return t.data_ptr(), t.numel(), dt
    dt = _COMPLEX.get(t.dtype)
    if dt is not None:
        return t.data_ptr(), 2 * t.numel(), dt
    return t.data_ptr(), t.numel() * t.element_size(), B.UINT8


def units(t):
    """dcomm elements per torch element of t, as raw() counts them."""
    if t.dtype in _DTYPES:
        return 1
    return 2 if t.dtype in _COMPLEX else t.element_size()


_OP_NAMES = {}  # RedOpType -> name: reading the enum's name costs a microsecond a call


def op_name(op):
    """The ReduceOp's name ("SUM", ...) from a ReduceOp, its RedOpType, or None (SUM)."""
    if op is None:
        return "SUM"
    inner = getattr(op, "op", op)  # ReduceOp wraps a RedOpType in torch >= 1.13
    try:
        return _OP_NAMES[inner]
    except (KeyError, TypeError):  # not seen yet, or not hashable
        pass
    name = getattr(inner, "name", None)
    if name is None:
        for n in _OPS:
            if op == getattr(ReduceOp, n):
                return n
        return str(op)
    try:
        _OP_NAMES[inner] = name  # an enum: a handful of values
    except TypeError:
        pass
    return name


def reduction(t, op):
    """(dtype, dcomm op, widen_to) for reducing t with op; widen_to is a torch dtype or None."""
    name = op_name(op)
    dt = t.dtype  # read once: each read makes a Python object
    if dt == torch.bool:
        if name not in _BOOL_OPS:
            raise InvalidArgument(-1, f"ReduceOp.{name} is not defined for bool tensors")
        return B.UINT8, _BOOL_OPS[name], None
    if name not in _OPS:
        raise NotSupported(-7, f"ReduceOp.{name} is not supported by the dcomm backend")
    if dt in _COMPLEX:
        if name not in ("SUM", "AVG"):
            raise InvalidArgument(-1, f"ReduceOp.{name} is not defined for complex tensors")
        return _COMPLEX[dt], _OPS[name], None
    if dt in _WIDEN:
        return _DTYPES[_WIDEN[dt]], _OPS[name], _WIDEN[dt]
    if dt not in _DTYPES:
        raise InvalidArgument(-1, f"the dcomm backend cannot reduce {dt} tensors")
    if name in ("BAND", "BOR", "BXOR") and dt.is_floating_point:
        raise InvalidArgument(-1, f"ReduceOp.{name} needs an integer tensor, got {dt}")
    return _DTYPES[dt], _OPS[name], None


class Out:
    """A writable contiguous view of output tensor t; done() copies back when t was not contiguous."""

    __slots__ = ("t", "c")

    def __init__(self, t, widen=None):
        self.t = t
        if widen is not None:
            self.c = t.to(widen)
        else:
            self.c = t if t.is_contiguous() else t.contiguous()

    def done(self):
        if self.c is not self.t:
            self.t.copy_(self.c)


def contiguous(t):
    return t if t.is_contiguous() else t.contiguous()


def check_device(tensors, on_gpu):
    for t in tensors:
        if (t.is_cuda if on_gpu else t.is_cpu) and not t.is_sparse:
            continue  # the common case, in three attribute reads
        if t.device.type not in ("cpu", "cuda"):  # meta, mps, xla, ...: no memory dcomm can address
            raise InvalidArgument(-1, f"a tensor on device '{t.device}' was given, but the dcomm backend takes "
                                      f"{'CUDA' if on_gpu else 'CPU'} tensors on this world "
                                      f"({A.backend_name()}); move it with .to('{'cuda' if on_gpu else 'cpu'}')")
        if t.is_cuda != on_gpu:
            where = "CUDA" if t.is_cuda else "CPU"
            need = "CUDA tensors (DCOMM_BACKEND=nccl)" if on_gpu else "CPU tensors"
            raise InvalidArgument(-1, f"a {where} tensor was given, but this dcomm world ({A.backend_name()}) "
                                      f"takes {need}; start the job with DCOMM_BACKEND="
                                      f"{'tcp' if t.is_cuda is False else 'nccl'} for {where} tensors")
        if t.is_sparse:
            raise InvalidArgument(-1, "sparse tensors are not supported by the dcomm backend")
