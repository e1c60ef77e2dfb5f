"""np_worker.py: the dcomm package without torch (numpy arrays and other
buffers), one process per rank under dcomm-run (tests/torch/test_package.py)."""
import array
import sys
import tempfile

import numpy as np

import dcomm


def main():
    ckdir = sys.argv[1]
    dcomm.init()
    r, n = dcomm.rank(), dcomm.world_size()
    assert 0 <= dcomm.local_rank() < dcomm.local_world_size()
    x = np.full(7, r + 1, np.float64)
    dcomm.all_reduce(x)
    assert (x == n * (n + 1) / 2).all(), x
    b = array.array("i", [r * 10 + i for i in range(3)])  # not numpy: any buffer
    dcomm.broadcast(b, n - 1)
    assert list(b) == [(n - 1) * 10 + i for i in range(3)], b
    out = np.zeros(2 * n, np.int64)
    dcomm.all_gather(np.array([r, -r], np.int64), out)
    assert out.tolist() == [v for i in range(n) for v in (i, -i)], out
    m = np.array([0b1010 | (1 << r)], np.uint32)
    dcomm.all_reduce(m, op=dcomm.BOR)
    assert m[0] == 0b1010 | ((1 << n) - 1), m
    bf = np.ones(4, np.uint16)  # bfloat16 bit patterns through dtype=
    dcomm.all_gather(bf, np.zeros(4 * n, np.uint16), dtype="bfloat16")
    send = np.arange(sum(range(1, n + 1)), dtype=np.float32) + 100 * r  # uneven: j+1 to rank j
    recv = np.zeros(n * (r + 1), np.float32)
    dcomm.all_to_allv(send, [j + 1 for j in range(n)], recv, [r + 1] * n)
    starts = [sum(range(1, r + 1))] * n
    want = np.concatenate([np.arange(starts[j], starts[j] + r + 1) + 100 * j for j in range(n)]).astype(np.float32)
    assert (recv == want).all(), (recv, want)
    # a named group of the first two ranks, created by its members alone
    if r < 2:
        g = dcomm.new_group([0, 1], name="pair")
        y = np.ones(3, np.float32)
        dcomm.all_reduce(y, group=g)
        assert (y == 2).all() and g.size == 2 and g.rank == r
        try:
            dcomm.new_group([0, 1], name="pair")
            raise AssertionError("a second live group with the same name was accepted")
        except dcomm.InvalidArgument as e:
            assert "pair" in str(e), e
        g.free()
    # any-source receive and probe
    if r == 0:
        srcs = set()
        for _ in range(n - 1):
            buf = np.zeros(2, np.int32)
            srcs.add(dcomm.recv(buf, tag=5))
            assert buf[0] == buf[1] * 3
        assert srcs == set(range(1, n)), srcs
        assert dcomm.probe(tag=99, timeout=0) is None
    else:
        dcomm.send(np.array([3 * r, r], np.int32), 0, tag=5)
    # errors carry the code and the library's sentence
    try:
        dcomm.all_gather(np.zeros(2, np.float32), np.zeros(3, np.float32))
        raise AssertionError("a short output was accepted")
    except dcomm.InvalidArgument as e:
        assert e.code == -1 and e.name == "DCOMM_EINVAL" and "all_gather" in str(e), e
    try:
        dcomm.all_reduce(np.zeros(2, np.float32), op=dcomm.BAND)
        raise AssertionError("BAND on float32 was accepted")
    except dcomm.InvalidArgument as e:
        assert "float32" in e.detail, e
    try:
        dcomm.all_reduce(np.zeros(3, np.float16)[::2])
        raise AssertionError("a strided array was accepted")
    except dcomm.InvalidArgument as e:
        assert "contiguous" in str(e), e
    # checkpoints: rank 0's bytes committed, read back by everyone
    assert dcomm.elastic_enabled()
    assert dcomm.checkpoint_load(ckdir) is None
    dcomm.checkpoint_save(ckdir, 12, b"state-at-12" if r == 0 else None)
    step, data = dcomm.checkpoint_load(ckdir)
    assert (step, data) == (12, b"state-at-12"), (step, data)
    dcomm.barrier()
    print(f"OK package rank={r}", flush=True)
    dcomm.finalize()
    try:
        dcomm.rank()
        raise AssertionError("rank() worked after finalize")
    except dcomm.NotInitialized:
        pass


if __name__ == "__main__":
    main()
