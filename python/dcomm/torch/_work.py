"""_work.py: asynchronous execution of one process group's operations.

Each ProcessGroupDcomm owns an Executor: one thread that runs the group's
operations in the order they were posted (dcomm allows one thread at a time
per group), so `async_op=True` calls and DDP's bucketed all_reduce return at
once and overlap with the caller's work. Receives do not block that thread:
a posted receive waits in a list and is matched with dcomm_probe as its
message arrives (from its peer, or from any peer for recv_anysource), in
posting order; meanwhile later operations run, so an irecv posted before
the matching isend of the same rank never deadlocks.

A synchronous call (dist.all_reduce without async_op: torch waits for the
Work as soon as it is returned) runs on the calling thread when the group is
idle (run_now), with no queue and no thread woken; a thread that waits for
an operation that is next in line while nothing runs runs it itself
instead of waking the executor and being woken back (run_if_next). Either
way the order is the posting order.

Work is what the group's calls return: wait() raises the dcomm.Error of a
failed operation (its real class: PeerLost, Mismatch, ...), get_future()
gives a torch Future whose value is the list of output tensors and which
completes with an error when the operation failed (DDP's reducer relies on
both). A Work stays referenced until someone waited on it or took its
future, because the C++ side of torch may call its methods after Python
dropped it.
"""
import collections
import threading
import time

import torch
from torch._C._distributed_c10d import Work as _CWork

from .. import _api as A
from .._errors import Error, TimedOut, error_for
from .._lib import has, lib

_LIVE = set()
_LIVE_LOCK = threading.Lock()
_FINISHED = threading.Event()  # the _done of every Work made finished (Executor.run_now); never cleared
_FINISHED.set()


def _unwrap(fut):
    v = fut.value()
    if isinstance(v, BaseException):
        raise v
    return v


class Work(_CWork):
    """The handle of one posted operation."""

    def __init__(self, outputs, what, executor=None, finished=False, exc=None):
        super().__init__()
        self._executor = executor  # for wait(): run the op here when it is next and nobody runs one
        self._outputs = outputs
        self._what = what
        self._done = _FINISHED if finished else threading.Event()  # a Work born finished shares one
        self._lock = threading.Lock()
        self._exc = exc
        self._src = -1
        self._fut = None  # the future handed out: completes with the outputs or an error
        self._base = None
        with _LIVE_LOCK:
            _LIVE.add(self)

    def _finish(self, exc=None, src=-1):
        with self._lock:
            self._exc, self._src = exc, src
            self._done.set()
            base = self._base
        if base is not None:
            base.set_result(exc if exc is not None else self._outputs)

    def _release(self):
        with _LIVE_LOCK:
            _LIVE.discard(self)

    def wait(self, timeout=None):
        secs = None
        if timeout is not None:
            secs = timeout.total_seconds() if hasattr(timeout, "total_seconds") else float(timeout)
            if secs <= 0:
                secs = None
        if not self._done.is_set() and self._executor is not None:
            self._executor.run_if_next(self)
        if not self._done.wait(secs):
            raise TimedOut(-3, f"{self._what}: not done within {secs} s (Work.wait timeout)")
        self._release()
        if self._exc is not None:
            raise self._exc
        return True

    def is_completed(self):
        return self._done.is_set()

    def is_success(self):
        return self._done.is_set() and self._exc is None

    def exception(self):
        return self._exc

    def result(self):
        self.wait()
        return self._outputs

    def source_rank(self):
        return self._src

    def _source_rank(self):
        return self._src

    def synchronize(self):
        pass

    def get_future(self):
        with self._lock:
            if self._fut is None:
                self._base = torch.futures.Future()
                self._fut = self._base.then(_unwrap)
                if self._done.is_set():
                    self._base.set_result(self._exc if self._exc is not None else self._outputs)
        # The future carries the result from here on: the C++ side keeps it.
        self._fut.add_done_callback(lambda _f: self._release())
        return self._fut


class _Recv:
    __slots__ = ("peer", "tag", "run", "work", "deadline")

    def __init__(self, peer, tag, run, work, deadline):
        self.peer, self.tag, self.run, self.work, self.deadline = peer, tag, run, work, deadline


class Executor:
    """Runs one dcomm group's operations on one thread, in posting order; see the module's comment."""

    POLL_S = 0.0005  # how long one probe may wait for a receive's message

    def __init__(self, group, label, timeout_s):
        self.group = group  # dcomm Group, or None for the world
        self.timeout_s = timeout_s
        self._q = collections.deque()
        self._no_probe = not has("dcomm_probe")  # also set once the backend refuses a probe (nccl)
        self._recvs = []
        self._cv = threading.Condition()
        self._stopping = False
        self._run_lock = threading.Lock()  # held while one of the group's calls runs, by any thread
        self._thread = threading.Thread(target=self._loop, name=f"dcomm-{label}", daemon=True)
        self._thread.start()

    def submit(self, fn, outputs, what):
        """Queues fn() (raising a dcomm.Error on failure) and returns its Work."""
        w = Work(outputs, what, self)
        self._put((fn, w))
        return w

    def run_now(self, fn, outputs, what):
        """Runs fn() on the calling thread when nothing of the group is queued or running, and returns
        its finished Work (an error is in the Work, as from the executor); None when the group is busy
        (then the caller submits). For a caller that waits right away (see ProcessGroupDcomm._post):
        the op starts at once either way, without the queue, its locks and two thread wake-ups."""
        if self._q or not self._run_lock.acquire(blocking=False):
            return None
        try:
            if self._q or self._stopping:
                return None
            try:  # _run's try/except, written out: a shared helper cost this path 0.5 us a call
                fn()
            except BaseException as e:  # every failure reaches the Work
                return Work(outputs, what, finished=True, exc=e)
            return Work(outputs, what, finished=True)
        finally:
            self._run_lock.release()

    def run_if_next(self, work):
        """Called by a thread about to wait for work: when work's operation is the next one
        and no operation is running, that thread runs it itself (the executor thread would
        only add two thread wake-ups to a synchronous call). Order is kept: whoever holds
        the run lock runs the head of the queue."""
        if not self._run_lock.acquire(blocking=False):
            return
        try:
            with self._cv:
                head = self._q[0] if self._q else None
                if not isinstance(head, tuple) or head[1] is not work or self._stopping:
                    return
                fn, w = self._q.popleft()
            self._run(fn, w)
        finally:
            self._run_lock.release()

    @staticmethod
    def _run(fn, w):
        try:
            fn()
            w._finish()
        except BaseException as e:  # every failure reaches the Work
            w._finish(e)

    def submit_recv(self, peer, tag, run, outputs, what):
        """Queues a receive: run(src) takes the message from src once dcomm_probe saw it."""
        w = Work(outputs, what)  # never run by a waiter: it waits for its message
        self._put(_Recv(peer, tag, run, w, None))
        return w

    def _put(self, item):
        with self._cv:
            if self._stopping:
                item_work = item.work if isinstance(item, _Recv) else item[1]
                item_work._finish(Error(-5, "the process group was shut down (destroyed, or recovering)"))
                return
            self._q.append(item)
            self._cv.notify()

    def stop(self, why, timeout=None):
        """Fails what has not started, lets the running call end, and stops the thread."""
        with self._cv:
            self._stopping = True
            pending = list(self._q) + self._recvs
            self._q.clear()
            self._recvs = []
            self._cv.notify()
        for item in pending:
            (item.work if isinstance(item, _Recv) else item[1])._finish(Error(-5, why))
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def _loop(self):
        while True:
            with self._cv:
                while not self._q and not self._recvs and not self._stopping:
                    self._cv.wait()
                if self._stopping:
                    return
            with self._run_lock:
                with self._cv:
                    item = self._q.popleft() if self._q else None
                if isinstance(item, _Recv):
                    item.deadline = time.monotonic() + self.timeout_s
                    self._recvs.append(item)
                elif item is not None:
                    self._run(*item)
                if self._recvs:
                    self._progress_recvs(wait=item is None)

    def _progress_recvs(self, wait):
        if self._no_probe:
            self._blocking_recvs()
            return
        matched = False
        for r in list(self._recvs):
            try:
                try:
                    got = A.probe(r.peer, r.tag, self.group, 0.0)
                except Error as e:
                    if e.code != -7:
                        raise
                    self._no_probe = True  # the backend cannot probe (nccl): receive in order, blocking
                    self._blocking_recvs()
                    return
                if got is None:
                    if time.monotonic() > r.deadline:
                        raise TimedOut(-3, f"{r.work._what}: no message with tag {r.tag} from "
                                           f"{'any rank' if r.peer < 0 else 'rank %d' % r.peer} within "
                                           f"{self.timeout_s:g} s")
                    continue
                self._recvs.remove(r)
                matched = True
                r.run(got[0])
                r.work._finish(src=got[0])
            except BaseException as e:
                if r in self._recvs:
                    self._recvs.remove(r)
                r.work._finish(e)
                if isinstance(e, Error) and e.code in (-4, -5):  # the group is broken: fail every receive
                    for other in self._recvs:
                        other.work._finish(error_for(e.code, e.detail))
                    self._recvs = []
                    return
        if wait and not matched and self._recvs:
            with self._cv:
                if self._q or self._stopping:
                    return
            first = self._recvs[0]
            try:  # sleeps in poll() until a message or POLL_S passes
                A.probe(first.peer, first.tag, self.group, self.POLL_S)
            except Error:
                pass  # seen again by the next pass

    def _blocking_recvs(self):
        """Without a probe (an older libdcomm, or a backend such as nccl that has none): receives block
        the thread in order."""
        while self._recvs:
            r = self._recvs.pop(0)
            try:
                if r.peer < 0:
                    raise error_for(-7, "recv from any source needs dcomm_probe, which this backend (or libdcomm) "
                                          "lacks")
                r.run(r.peer)
                r.work._finish(src=r.peer)
            except BaseException as e:
                r.work._finish(e)


def check(rc):
    if rc < 0:
        raise error_for(rc)
    return rc


__all__ = ["Work", "Executor", "check", "lib"]
