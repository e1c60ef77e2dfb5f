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
import os
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "stubs"))  # expecttest
os.environ.setdefault("BACKEND", "dcomm")
os.environ.setdefault("WORLD_SIZE", "2")
os.environ.setdefault("TEMP_DIR", tempfile.mkdtemp(prefix="dcomm-torch-suite-"))
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


class TestDistBackendWithSpawn(TestDistBackend, DistributedTest._DistTestBase):
    def setUp(self):
        super().setUp()
        self._spawn_processes()


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
