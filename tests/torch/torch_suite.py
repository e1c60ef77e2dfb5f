"""torch_suite.py: torch's own distributed test suite (DistributedTest._DistTestBase)
against the "dcomm" backend, driven as pytorch's test_distributed_spawn.py
drives it: every test spawns WORLD_SIZE processes that init through a
file:// store and run the case.

    WORLD_SIZE=2 python3 tests/torch/torch_suite.py [-k pattern] [-v]

The backend is added to torch's feature lists for third-party backends
("plugin"), sub-groups and DDP, so those cases run rather than skip.
tests/torch/torch-suite.sh runs it and checks the skips against
tests/torch/expected-skips.txt.
"""
import atexit
import os
import shutil
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "stubs"))  # expecttest
os.environ.setdefault("BACKEND", "dcomm")
os.environ.setdefault("WORLD_SIZE", "2")
if "TEMP_DIR" not in os.environ:
    # Made once, by the process that runs the suite (the ranks it spawns
    # import this file with TEMP_DIR set), and removed when it exits.
    os.environ["TEMP_DIR"] = tempfile.mkdtemp(prefix="dcomm-torch-suite-")
    atexit.register(shutil.rmtree, os.environ["TEMP_DIR"], True)
# The harness turns on DDP's ReplicatedTensor mode in every rank; it imports
# torch.distributed._shard, which torch 1.13 cannot import on Python 3.11
# (a dataclass with a mutable default): every DDP case then fails, with gloo
# too. Keep the mode off, as NO_REPLICATED_TENSOR_DDP does in newer torch.
os.environ.setdefault("NO_REPLICATED_TENSOR_DDP", "1")
import torch.nn.parallel._replicated_tensor_ddp_utils as _rt  # noqa: E402

_rt._set_ddp_with_replicated_tensor = lambda value: None

import dcomm.torch  # noqa: E402,F401  registers "dcomm" in every spawned process (they import this file)
from torch.testing._internal.common_distributed import DistTestCases  # noqa: E402

for feature in ("plugin", "subgroup", "ddp"):
    DistTestCases.backend_feature[feature].add("dcomm")

from torch.testing._internal.common_utils import run_tests  # noqa: E402
from torch.testing._internal.distributed.distributed_test import DistributedTest, TestDistBackend  # noqa: E402


# Cases torch gates on the backend's *name* ("Only MPI supports all_to_all",
# "Test requires backend to be one of {'gloo'}") although they only use
# what dcomm implements: they run here unchanged, without the gate. The list
# is opened-cases.txt; SUITE_OPEN=all opens every name-gated CPU case (to
# find more).
_GATES = ("Test requires backend to be one of", "Only MPI supports", "Only Gloo", "Only gloo", "GLOO ",
          "get_future is only supported", "Only Nccl & Gloo")
_GPU_WORDS = ("CUDA", "cuda", "GPU", "gpu", "NCCL", "{'nccl'}")  # a reason naming only nccl


def _opened():
    if os.environ.get("SUITE_OPEN") == "all":
        return None
    with open(os.path.join(HERE, "opened-cases.txt")) as f:
        return {line.split()[0] for line in f if line.strip() and not line.startswith("#")}


def _open_gated(cls):
    wanted = _opened()
    for name in dir(DistributedTest._DistTestBase):
        fn = getattr(DistributedTest._DistTestBase, name)
        why = getattr(fn, "__unittest_skip_why__", "")
        if not name.startswith("test_") or not getattr(fn, "__unittest_skip__", False):
            continue
        if not why.startswith(_GATES) or any(w in why or w in name for w in _GPU_WORDS):
            continue
        if wanted is not None and name not in wanted:
            continue

        def run(self, _fn=fn):
            return _fn(self)
        run.__name__ = name
        run.__doc__ = f"{fn.__doc__ or name} [torch gates it: {why}]"
        setattr(cls, name, run)
    return cls


@_open_gated
class TestDistBackendWithSpawn(TestDistBackend, DistributedTest._DistTestBase):
    def setUp(self):
        super().setUp()
        self._spawn_processes()


def _deselect_listed(cls):
    """SUITE_DESELECT_LISTED=1: the cases expected-skips.txt lists for this world size are not run at
    all (most skip only after spawning their processes, ~2 s each): make check's quicker pass."""
    if os.environ.get("SUITE_DESELECT_LISTED") != "1":
        return
    world = os.environ["WORLD_SIZE"]
    with open(os.path.join(HERE, "expected-skips.txt")) as f:
        for line in f:
            parts = line.split()
            if len(parts) >= 2 and parts[0] == world and hasattr(cls, parts[1]):
                setattr(cls, parts[1], None)  # not callable: the loader passes it by


_deselect_listed(TestDistBackendWithSpawn)


class _Recorder(unittest.TextTestResult):
    """Also writes `<status> <test> <reason>` lines to $SUITE_RESULTS for torch-suite.sh."""

    def _record(self, status, test, reason=""):
        path = os.environ.get("SUITE_RESULTS")
        if path:
            with open(path, "a") as f:
                f.write(f"{status} {test.id().rsplit('.', 1)[-1]} {reason}".rstrip().replace("\n", " ") + "\n")

    def addSuccess(self, test):
        super().addSuccess(test)
        self._record("PASS", test)

    def addSkip(self, test, reason):
        super().addSkip(test, reason)
        self._record("SKIP", test, reason)

    def addFailure(self, test, err):
        super().addFailure(test, err)
        self._record("FAIL", test, str(err[1]).splitlines()[0] if str(err[1]) else "")

    def addError(self, test, err):
        super().addError(test, err)
        self._record("ERROR", test, str(err[1]).splitlines()[0] if str(err[1]) else "")


if __name__ == "__main__":
    if os.environ.get("SUITE_RESULTS"):
        unittest.main(testRunner=unittest.TextTestRunner(resultclass=_Recorder, verbosity=1))
    else:
        run_tests()
