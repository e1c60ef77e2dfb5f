"""_lib.py: loads libdcomm with ctypes and declares the C prototypes.

The library is found, in order: $DCOMM_LIBRARY (a path to libdcomm.so, as
the build tree's tests set it), the directory `make install` recorded in
_config.py, then the dynamic loader's search path. Calls added to the C
library after this package was written are optional: has(name) says
whether the loaded library has them.
"""
import ctypes
import ctypes.util
import os

_c_int = ctypes.c_int
_c_size = ctypes.c_size_t
_c_double = ctypes.c_double
_c_void_p = ctypes.c_void_p
_c_char_p = ctypes.c_char_p
_c_int_p = ctypes.POINTER(ctypes.c_int)
_c_size_p = ctypes.POINTER(ctypes.c_size_t)
_group = ctypes.c_void_p

# name: (restype, argtypes). Every int-returning call gives 0 or a negative
# DCOMM_E* code.
_PROTOTYPES = {
    "dcomm_init": (_c_int, [_c_char_p, _c_char_p]),
    "dcomm_finalize": (_c_int, []),
    "dcomm_initialized": (_c_int, []),
    "dcomm_rank": (_c_int, []),
    "dcomm_world_size": (_c_int, []),
    "dcomm_local_rank": (_c_int, []),
    "dcomm_local_world_size": (_c_int, []),
    "dcomm_backend_name": (_c_char_p, []),
    "dcomm_new_group": (_c_int, [_c_int_p, _c_int, ctypes.POINTER(_group)]),
    "dcomm_new_group_named": (_c_int, [_c_char_p, _c_int_p, _c_int, ctypes.POINTER(_group)]),
    "dcomm_group_split": (_c_int, [_group, _c_int, _c_int, ctypes.POINTER(_group)]),
    "dcomm_group_rank": (_c_int, [_group]),
    "dcomm_group_size": (_c_int, [_group]),
    "dcomm_group_world_rank": (_c_int, [_group, _c_int]),
    "dcomm_group_free": (_c_int, [_group]),
    "dcomm_group_set_timeout": (_c_int, [_group, _c_double]),
    "dcomm_all_reduce": (_c_int, [_c_void_p, _c_size, _c_int, _c_int, _group]),
    "dcomm_reduce": (_c_int, [_c_void_p, _c_size, _c_int, _c_int, _c_int, _group]),
    "dcomm_broadcast": (_c_int, [_c_void_p, _c_size, _c_int, _c_int, _group]),
    "dcomm_all_gather": (_c_int, [_c_void_p, _c_void_p, _c_size, _c_int, _group]),
    "dcomm_gather": (_c_int, [_c_void_p, _c_void_p, _c_size, _c_int, _c_int, _group]),
    "dcomm_scatter": (_c_int, [_c_void_p, _c_void_p, _c_size, _c_int, _c_int, _group]),
    "dcomm_reduce_scatter": (_c_int, [_c_void_p, _c_void_p, _c_size, _c_int, _c_int, _group]),
    "dcomm_all_to_all": (_c_int, [_c_void_p, _c_void_p, _c_size, _c_int, _group]),
    "dcomm_all_to_allv": (_c_int, [_c_void_p, _c_size_p, _c_size_p, _c_void_p, _c_size_p, _c_size_p, _c_int, _group]),
    "dcomm_send": (_c_int, [_c_void_p, _c_size, _c_int, _c_int, _c_int, _group]),
    "dcomm_recv": (_c_int, [_c_void_p, _c_size, _c_int, _c_int, _c_int, _group]),
    "dcomm_recv_any": (_c_int, [_c_void_p, _c_size, _c_int, _c_int, _group, _c_int_p]),
    "dcomm_probe": (_c_int, [_c_int, _c_int, _group, _c_double, _c_int_p, _c_size_p]),
    "dcomm_barrier": (_c_int, [_group]),
    "dcomm_set_stream": (_c_int, [_group, _c_void_p]),
    "dcomm_strerror": (_c_char_p, [_c_int]),
    "dcomm_error_name": (_c_char_p, [_c_int]),
    "dcomm_last_error": (_c_char_p, []),
    "dcomm_dtype_size": (_c_size, [_c_int]),
    "dcomm_version_string": (_c_char_p, []),
    "dcomm_generation": (ctypes.c_long, []),
    "dcomm_elastic_is_joiner": (_c_int, []),
    "dcomm_elastic_enabled": (_c_int, []),
    "dcomm_member_id": (_c_char_p, []),
    "dcomm_elastic_recoverable": (_c_int, [_c_int]),
    "dcomm_elastic_recover": (_c_int, []),
    "dcomm_checkpoint_save": (_c_int, [_c_char_p, ctypes.c_uint64, _c_void_p, _c_size]),
    "dcomm_checkpoint_load": (_c_int, [_c_char_p, ctypes.POINTER(_c_void_p), _c_size_p,
                                       ctypes.POINTER(ctypes.c_uint64)]),
}


def _candidates():
    env = os.environ.get("DCOMM_LIBRARY")
    if env:
        yield env
        return
    try:
        from . import _config  # written by `make install`
        yield os.path.join(_config.LIBDIR, "libdcomm.so.0")
    except ImportError:
        pass
    found = ctypes.util.find_library("dcomm")
    if found:
        yield found
    yield "libdcomm.so.0"


def _load():
    errors = []
    for path in _candidates():
        try:
            return ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
        except OSError as e:
            errors.append(f"{path}: {e}")
    raise ImportError("dcomm: cannot load libdcomm (set DCOMM_LIBRARY to the path of libdcomm.so.0); tried "
                      + "; ".join(errors))


lib = _load()
_missing = set()
for _name, (_res, _args) in _PROTOTYPES.items():
    try:
        _fn = getattr(lib, _name)
    except AttributeError:
        _missing.add(_name)
        continue
    _fn.restype = _res
    _fn.argtypes = _args
lib.free = ctypes.CDLL(None).free
lib.free.argtypes = [_c_void_p]
lib.free.restype = None


def has(name):
    """True when the loaded libdcomm has the C call `name`."""
    return name not in _missing
