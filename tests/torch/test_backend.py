"""test_backend.py: the torch.distributed backend "dcomm" with real processes.

Every op x dtype x group against a serial reference, async ops and futures,
point-to-point (tags, any source, irecv before isend), DDP equal to gloo,
bad input, and a rank that dies.
"""
import re

import pytest

from conftest import run_ranks


def ok_lines(outs, case):
    return {r: o for r, o in outs.items() if re.search(rf"^OK {case}\b", o, re.M)}


@pytest.mark.parametrize("n", [2, 3])
def test_every_op_dtype_and_group(n):
    rc, outs, text = run_ranks("ops", n)
    assert rc == 0, text
    assert len(ok_lines(outs, "ops")) == n, text


def test_ops_under_torchrun_variables():
    """No dcomm launcher: dcomm's store is found through torch's own (env://, as torchrun starts workers)."""
    rc, outs, text = run_ranks("ops", 2, launcher="env")
    assert rc == 0, text
    assert len(ok_lines(outs, "ops")) == 2, text


def test_dcomm_rendezvous_scheme():
    rc, outs, text = run_ranks("async", 3, env={"TEST_INIT_METHOD": "dcomm://"})
    assert rc == 0, text
    assert len(ok_lines(outs, "async")) == 3, text


@pytest.mark.parametrize("n", [2, 4])
def test_async_futures_and_point_to_point(n):
    rc, outs, text = run_ranks("async", n)
    assert rc == 0, text
    assert len(ok_lines(outs, "async")) == n, text


def params(outs):
    got = set()
    for o in outs.values():
        m = re.search(r"^OK ddp rank=\d+ params=(.*)$", o, re.M)
        assert m, o
        got.add(m.group(1))
    assert len(got) == 1, "ranks ended with different parameters"
    return [float(v) for v in got.pop().split(",")]


def test_ddp_matches_gloo():
    rc, outs, text = run_ranks("ddp", 3, "dcomm")
    assert rc == 0, text
    ours = params(outs)
    rc, outs, text = run_ranks("ddp", 3, "gloo")
    assert rc == 0, text
    theirs = params(outs)
    assert len(ours) == len(theirs)
    for a, b in zip(ours, theirs):
        assert abs(a - b) <= 1e-6 * max(1.0, abs(b)), (a, b)


def test_bad_input_and_mismatch():
    """Bad input and a wrong-device (meta) tensor are refused clearly; mismatched collectives raise
    dcomm's EMISMATCH on the ranks themselves. The worker reports the exception it caught (and has
    no OK line at all when the call returned): its class, code and name are checked here."""
    rc, outs, text = run_ranks("errors", 2)
    assert rc == 0, text
    ok = ok_lines(outs, "errors")
    assert len(ok) == 2, text
    for r, o in ok.items():
        m = re.search(r"^OK errors rank=\d+ class=(\w+) code=(-?\d+) name=(\w+) message=(.*)$", o, re.M)
        assert m, o
        cls, code, name, message = m.groups()
        # rank 0 detects the mismatch; its abort carries the reason to the other rank
        assert (cls, int(code), name) == ("Mismatch", -6, "DCOMM_EMISMATCH"), f"rank {r}: {m.group(0)}"
        assert "DCOMM_EMISMATCH" in message and "mismatched calls" in message, f"rank {r}: {message}"
        assert "count 4" in message and "count 5" in message, f"rank {r}: {message}"


def test_reduce_scatter_tensor_and_avg():
    """reduce_scatter_tensor, _reduce_scatter_base and ReduceOp.AVG (neither of which torch 1.13's gloo
    has) on a world of 3 and a sub-group of 2."""
    rc, outs, text = run_ranks("rs_avg", 3)
    assert rc == 0, text
    assert len(ok_lines(outs, "rs_avg")) == 3, text


def test_monitored_barrier():
    """dist.monitored_barrier is gloo's only in torch 1.13; the group's own one is bounded and names the
    rank that stayed away."""
    rc, outs, text = run_ranks("monitored_barrier", 2, timeout=120)
    assert rc == 0, text
    ok = ok_lines(outs, "monitored_barrier")
    assert set(ok) == {0, 1}, text
    assert "absent" in ok[1], text
    assert "timed_out" in ok[0] and "DCOMM_ETIMEDOUT" in ok[0] and "rank 1" in ok[0], ok[0]


def test_dead_rank_raises_recoverable_error():
    rc, outs, text = run_ranks("peer_dies", 3, timeout=120)
    ok = ok_lines(outs, "peer_dies")
    assert set(ok) == {0, 1}, text
    for o in ok.values():
        after = float(re.search(r"after=([0-9.]+)", o).group(1))
        assert after < 30, o  # well inside the 300 s operation timeout: the death is detected, not waited out
