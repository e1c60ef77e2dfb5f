"""test_elastic.py: examples/torch/elastic_ddp.py under dcomm-run, 4 ranks.

A rank SIGKILLed mid-run, or rank 0 killed while it writes a checkpoint:
the survivors recover in-process (no worker restarted), finish on 3 ranks
and end with the failure-free run's loss.
"""
import os
import re
import subprocess
import sys

import pytest

from conftest import DCOMM_RUN, HERE

EXAMPLE = os.path.join(HERE, "..", "..", "examples", "torch", "elastic_ddp.py")


def run(tmp_path, name, *extra):
    if not DCOMM_RUN:
        pytest.skip("DCOMM_RUN is not set (run through make check)")
    ckpt = tmp_path / name
    p = subprocess.run([DCOMM_RUN, "--nproc-per-node", "4", "--", sys.executable, EXAMPLE, "--steps", "24",
                        "--checkpoint-every", "5", "--checkpoint-dir", str(ckpt), *extra],
                       capture_output=True, text=True, timeout=240)
    out = p.stdout + p.stderr
    m = re.search(r"final step=(\d+) world=(\d+) generation=(\d+) loss=(\S+)", out)
    assert m, out
    return int(m.group(1)), int(m.group(2)), int(m.group(3)), float(m.group(4)), out


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    step, world, gen, loss, out = run(tmp_path_factory.mktemp("ref"), "ckpt")
    assert (step, world) == (24, 4), out
    return loss


def test_rank_killed_mid_run(tmp_path, reference):
    step, world, gen, loss, out = run(tmp_path, "ckpt", "--kill-rank", "2", "--kill-at-step", "13")
    assert (step, world) == (24, 3), out
    assert gen >= 1, out
    assert "job finished: 3 workers exited 0, 1 died" in out, out  # no worker was restarted
    assert abs(loss - reference) <= 1e-6 * abs(reference), (loss, reference)


def test_rank0_killed_in_checkpoint_save(tmp_path, reference):
    step, world, gen, loss, out = run(tmp_path, "ckpt", "--kill-in-save", "--kill-at-step", "10")
    assert (step, world) == (24, 3), out
    assert abs(loss - reference) <= 1e-6 * abs(reference), (loss, reference)
    committed = (tmp_path / "ckpt" / "COMMITTED").read_text()
    assert "-g0.dcp" not in committed.split("\n")[-2] if committed.strip() else False, committed
