"""_errors.py: the exception hierarchy of the dcomm package.

Every failing C call raises a subclass of dcomm.Error carrying the DCOMM_E*
code (`code`, negative), its name (`name`, e.g. "DCOMM_EPEERLOST") and the
library's sentence about what failed (`detail`, from dcomm_last_error()).
Failures that dcomm_elastic_recover() can repair (a lost peer, a revoked
communicator, a timeout) derive from RecoverableError.
"""
from ._lib import lib


class Error(RuntimeError):
    """A dcomm call failed. code: the DCOMM_E* value; detail: the library's message."""

    code = None

    def __init__(self, code, detail=""):
        self.code = code
        self.name = (lib.dcomm_error_name(code) or b"DCOMM_E?").decode()
        self.detail = detail
        msg = (lib.dcomm_strerror(code) or b"unknown error").decode()
        super().__init__(f"{self.name}: {detail or msg}")


class RecoverableError(Error):
    """A failure dcomm_elastic_recover() can repair (dcomm_elastic_recoverable)."""


class InvalidArgument(Error, ValueError):
    """DCOMM_EINVAL: a bad argument or setting; the message names it."""


class NotInitialized(Error):
    """DCOMM_ENOTINIT: dcomm.init() has not run, or finalize() has."""


class TimedOut(RecoverableError, TimeoutError):
    """DCOMM_ETIMEDOUT: the operation's timeout expired."""


class PeerLost(RecoverableError):
    """DCOMM_EPEERLOST: a peer died or its connection broke."""


class Revoked(RecoverableError):
    """DCOMM_EREVOKED: the communicator was revoked or aborted."""


class Mismatch(Error):
    """DCOMM_EMISMATCH: ranks called different collectives or sizes."""


class NotSupported(Error):
    """DCOMM_ENOTSUP: not supported by this backend or build."""


class AuthError(Error):
    """DCOMM_EAUTH: the handshake was refused (wrong job or token)."""


class BackendError(Error):
    """DCOMM_EBACKEND: an internal failure of the backend (e.g. NCCL)."""


class SystemCallError(Error, OSError):
    """DCOMM_ESYSTEM: an operating-system call failed."""


class OutOfMemory(Error, MemoryError):
    """DCOMM_ENOMEM."""


class NotMember(Error):
    """DCOMM_ENOTMEMBER: this process is not a member of the group."""


class ProtocolError(Error):
    """DCOMM_EPROTO: a malformed message arrived."""


class NotFound(Error, LookupError):
    """DCOMM_ENOTFOUND: no such key or item (e.g. no checkpoint)."""


_BY_CODE = {-1: InvalidArgument, -2: NotInitialized, -3: TimedOut, -4: PeerLost, -5: Revoked, -6: Mismatch,
            -7: NotSupported, -8: AuthError, -9: BackendError, -10: SystemCallError, -11: OutOfMemory,
            -12: NotMember, -13: ProtocolError, -14: NotFound}


def error_for(code, detail=None):
    """The exception for a negative DCOMM_E* code, with the calling thread's last error as detail."""
    if detail is None:
        detail = (lib.dcomm_last_error() or b"").decode(errors="replace")
    return _BY_CODE.get(code, Error)(code, detail)


def check(rc):
    """Raises the matching Error for a negative return code; returns rc otherwise."""
    if rc < 0:
        raise error_for(rc)
    return rc
