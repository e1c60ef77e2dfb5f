"""conftest.py: launching test ranks for the torch backend's pytest suites.

run_ranks() starts `worker.py CASE` (or another script) on n ranks under the build's dcomm-run
(or, with launcher="env", as plain processes with torchrun's variables and
torch's own store), bounded in time, and returns (exit code, {rank: output}).
The build tree is found through DCOMM_RUN and DCOMM_LIBRARY, which
`make check` sets (tests/torch/run.sh).
"""
import os
import re
import socket
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "worker.py")
DCOMM_RUN = os.environ.get("DCOMM_RUN")


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _split(out):
    ranks = {}
    for line in out.splitlines():
        m = re.match(r"\[(\d+)\]: ?(.*)", line)
        if m:
            ranks.setdefault(int(m.group(1)), []).append(m.group(2))
    return {r: "\n".join(v) for r, v in ranks.items()}


def run_ranks(case, n, *args, launcher="dcomm-run", timeout=240, env=None, script=WORKER):
    e = dict(os.environ)
    e.update(env or {})
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                "DCOMM_INIT_METHOD", "DCOMM_USE_AGENT_STORE", "DCOMM_AGENT_STORE", "DCOMM_ELASTIC"):
        if env is None or var not in env:
            e.pop(var, None)
    cmd = [sys.executable, script, *([] if case is None else [case]), *args]  # case None: a script without one
    if launcher == "dcomm-run":
        if not DCOMM_RUN:
            pytest.skip("DCOMM_RUN is not set (run through make check)")
        p = subprocess.run([DCOMM_RUN, "--nproc-per-node", str(n), "--"] + cmd, env=e, capture_output=True,
                           text=True, timeout=timeout)
        out = p.stdout + p.stderr
        return p.returncode, _split(out), out
    # torchrun's variables, torch's own TCPStore on MASTER_PORT (no dcomm launcher)
    port = _free_port()
    procs = []
    for r in range(n):
        re_ = dict(e, RANK=str(r), WORLD_SIZE=str(n), LOCAL_RANK=str(r), LOCAL_WORLD_SIZE=str(n),
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        procs.append(subprocess.Popen(cmd, env=re_, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    outs, rc = {}, 0
    for r, p in enumerate(procs):
        try:
            outs[r] = p.communicate(timeout=timeout)[0]
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise
        rc = rc or p.returncode
    return rc, outs, "\n".join(f"--- rank {r}\n{o}" for r, o in outs.items())
