"""_buffers.py: turns Python buffers into (address, element count, dtype).

Any object with the buffer protocol works (numpy arrays, bytearray,
array.array, memoryview); it must be C-contiguous. The dcomm dtype comes
from the buffer's format, or from an explicit `dtype` (e.g. "bfloat16",
which no buffer format names). Outputs must be writable; a read-only input
is passed by address too (the library never writes inputs).
"""
import ctypes

from ._errors import InvalidArgument

# dcomm_dtype_t values (include/dcomm.h).
INT8, UINT8, INT32, UINT32, INT64, UINT64, FLOAT16, BFLOAT16, FLOAT32, FLOAT64 = range(10)
DTYPE_NAMES = {"int8": INT8, "uint8": UINT8, "int32": INT32, "uint32": UINT32, "int64": INT64, "uint64": UINT64,
               "float16": FLOAT16, "bfloat16": BFLOAT16, "float32": FLOAT32, "float64": FLOAT64}
DTYPE_SIZES = {INT8: 1, UINT8: 1, INT32: 4, UINT32: 4, INT64: 8, UINT64: 8, FLOAT16: 2, BFLOAT16: 2, FLOAT32: 4,
               FLOAT64: 8}

# struct-module format letter -> (dtype, item size) for the sizes it can have.
_FORMATS = {("b", 1): INT8, ("B", 1): UINT8, ("c", 1): UINT8, ("?", 1): UINT8, ("e", 2): FLOAT16,
            ("f", 4): FLOAT32, ("d", 8): FLOAT64, ("i", 4): INT32, ("I", 4): UINT32, ("l", 4): INT32,
            ("L", 4): UINT32, ("l", 8): INT64, ("L", 8): UINT64, ("q", 8): INT64, ("Q", 8): UINT64,
            ("n", 8): INT64, ("N", 8): UINT64}


def dtype_of(name_or_value):
    """A dcomm dtype from its name ("float32") or value; InvalidArgument otherwise."""
    if isinstance(name_or_value, str):
        if name_or_value not in DTYPE_NAMES:
            raise InvalidArgument(-1, f"unknown dtype '{name_or_value}' (one of {', '.join(DTYPE_NAMES)})")
        return DTYPE_NAMES[name_or_value]
    if name_or_value not in DTYPE_SIZES:
        raise InvalidArgument(-1, f"unknown dtype value {name_or_value!r}")
    return name_or_value


class Buffer:
    """A view of one C-contiguous buffer: addr, count (elements), dtype, and the objects that keep it alive."""

    __slots__ = ("addr", "count", "dtype", "nbytes", "_keep")

    def __init__(self, obj, what, writable, dtype=None):
        try:
            mv = memoryview(obj)
        except TypeError:
            raise InvalidArgument(-1, f"{what}: a {type(obj).__name__} is not a buffer (give a numpy array, "
                                      "bytearray or other object with the buffer protocol)") from None
        if not mv.c_contiguous:
            raise InvalidArgument(-1, f"{what}: the buffer is not C-contiguous")
        if writable and mv.readonly:
            raise InvalidArgument(-1, f"{what}: the buffer is read-only, but dcomm writes into it")
        fmt = mv.format.lstrip("@=<>!")
        if dtype is None:
            dt = _FORMATS.get((fmt, mv.itemsize))
            if dt is None:
                raise InvalidArgument(-1, f"{what}: buffer format '{mv.format}' has no dcomm dtype "
                                          "(pass dtype=..., e.g. 'bfloat16')")
        else:
            dt = dtype_of(dtype)
        size = DTYPE_SIZES[dt]
        if mv.nbytes % size:
            raise InvalidArgument(-1, f"{what}: {mv.nbytes} bytes is not a whole number of {size}-byte elements")
        self.dtype, self.nbytes, self.count = dt, mv.nbytes, mv.nbytes // size
        self._keep = (obj, mv)
        if mv.nbytes == 0:
            self.addr = None
        elif hasattr(obj, "__array_interface__"):
            self.addr = obj.__array_interface__["data"][0]
        elif not mv.readonly:
            self.addr = ctypes.addressof(ctypes.c_char.from_buffer(mv.cast("B")))
        else:  # read-only input without numpy: pass a private copy
            copy = bytearray(mv.cast("B"))
            self._keep = (obj, mv, copy)
            self.addr = ctypes.addressof(ctypes.c_char.from_buffer(copy))
