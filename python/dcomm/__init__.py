"""dcomm: Python interface to libdcomm, the fault-tolerant collective
communication runtime.

    import dcomm, numpy as np
    dcomm.init()                      # launcher detected: dcomm-run, torchrun, srun, mpirun
    x = np.ones(4, np.float32)
    dcomm.all_reduce(x)               # in place, over the world
    g = dcomm.new_group([0, 1])
    dcomm.finalize()

Every call mirrors the C call of the same name (man dcomm_<name>) and raises
a dcomm.Error subclass carrying the DCOMM_E* code and the library's message.
`import dcomm.torch` registers the torch.distributed backend "dcomm".
"""
from ._api import *  # noqa: F401,F403
from ._api import __all__ as _api_all
from ._buffers import (BFLOAT16, FLOAT16, FLOAT32, FLOAT64, INT8, INT32, INT64, UINT8, UINT32,  # noqa: F401
                       UINT64)
from ._errors import (AuthError, BackendError, Error, InvalidArgument, Mismatch, NotFound,  # noqa: F401
                      NotInitialized, NotMember, NotSupported, OutOfMemory, PeerLost, ProtocolError,
                      RecoverableError, Revoked, SystemCallError, TimedOut)
from ._lib import has  # noqa: F401

__version__ = version()
