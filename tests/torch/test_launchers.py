"""test_launchers.py: the dcomm backend under real launchers, and the shipped example.

torchrun (python3 -m torch.distributed.run, c10d rendezvous on loopback)
starts worker.py's `launch` case on 2 ranks: init_process_group("dcomm"),
an all_reduce and sub-groups, checked on every rank. examples/torch/primitives.py
runs under the build's dcomm-run on 3 ranks (rank 2 outside its sub-group).
"""
import os
import re
import signal
import subprocess
import sys

import pytest

from conftest import HERE, WORKER, run_ranks

PRIMITIVES = os.path.join(HERE, "..", "..", "examples", "torch", "primitives.py")


def test_torchrun_init_all_reduce_new_group(tmp_path):
    try:
        import torch.distributed.run  # noqa: F401
    except ImportError as e:  # pragma: no cover - Debian's python3-torch has it
        pytest.skip(f"torch.distributed.run (torchrun) is not importable: {e}")
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                        "DCOMM_INIT_METHOD", "DCOMM_USE_AGENT_STORE", "DCOMM_AGENT_STORE", "DCOMM_ELASTIC")}
    env["TMPDIR"] = str(tmp_path)  # torchrun's torchelastic_* folders go where pytest removes them
    # Port 0: the agent's store binds a free port itself (no race with other tests for a port picked
    # here). -r 2 -t 1: torch 1.13's torchrun on Python 3.11 fails in its log set-up without redirects
    # (dcomm_torch(7)); -t 1 tees the workers' stdout back, prefixed with [default<rank>]:.
    cmd = [sys.executable, "-m", "torch.distributed.run", "-r", "2", "-t", "1", "--log_dir", str(tmp_path / "logs"),
           "--nproc_per_node", "2", "--max_restarts", "0", "--rdzv_backend", "c10d",
           "--rdzv_endpoint", "127.0.0.1:0", "--rdzv_id", "dcomm-torchrun-test", WORKER, "launch"]
    p = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         start_new_session=True)
    try:
        out = p.communicate(timeout=120)[0]
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)  # torchrun and its workers
        out = p.communicate()[0]
        pytest.fail(f"torchrun did not finish within 120 s:\n{out}")
    logs = "".join(f"\n--- {f}\n{open(f, errors='replace').read()}"
                   for f in sorted(str(x) for x in (tmp_path / "logs").rglob("*.log")))
    assert p.returncode == 0, out + logs
    ok = dict(re.findall(r"^\[default(\d)\]:(OK launch rank=\d+ world=2 torchelastic=\S+)$", out, re.M))
    assert set(ok) == {"0", "1"}, out + logs
    for local, line in ok.items():
        assert f"rank={local} " in line and "torchelastic=dcomm-torchrun-test" in line, line


def test_primitives_example_under_dcomm_run():
    rc, outs, text = run_ranks(None, 3, script=PRIMITIVES, timeout=120)
    assert rc == 0, text
    assert set(outs) == {0, 1, 2}, text
    for r in range(3):
        assert re.search(rf"^rank:{r}, local_rank:{r}, world_size:3$", outs[r], re.M), text
    assert re.search(r"^global loss: 3\.0$", outs[0], re.M), text  # mean of 2, 3, 4
    assert re.search(r"^all primitives passed$", outs[0], re.M), text
    assert "job finished: 3 workers exited 0" in text, text
