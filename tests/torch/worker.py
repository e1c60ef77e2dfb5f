"""worker.py: the rank side of the torch backend's tests (tests/torch/test_*.py).

Run as `python3 worker.py CASE [args]` on every rank, under dcomm-run or
with torchrun's variables. Each case checks its results against a serial
reference computed locally (every rank's input is a function of its rank),
prints `OK <case> <details>` on success, and raises otherwise.
"""
import os
import sys
import time

import torch
import torch.distributed as dist

import dcomm
import dcomm.torch  # noqa: F401  (registers the backend)

DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8, torch.uint8, torch.int32,
          torch.int64, torch.int16, torch.bool, torch.complex64, torch.complex128]
INT_DTYPES = [torch.int8, torch.uint8, torch.int32, torch.int64, torch.int16]


def init(backend="dcomm"):
    dist.init_process_group(backend, init_method=os.environ.get("TEST_INIT_METHOD", "env://"))
    return dist.get_rank(), dist.get_world_size()


def value(rank, n, dtype, salt=0):
    """Rank rank's deterministic input: small values so every reduction is exact."""
    base = torch.arange(n, dtype=torch.float64) + 3 * rank + salt
    if dtype == torch.bool:
        return (base.long() % 2 == 0).logical_xor(torch.tensor(rank % 2 == 1))
    if dtype in (torch.complex64, torch.complex128):
        return torch.complex(base % 5, (base + 1) % 3).to(dtype)
    if dtype.is_floating_point:
        return (base % 7 - 2).to(dtype)
    return (base.long() % 5 + 1).to(dtype)


def reference(op, tensors):
    acc = tensors[0].clone()
    for t in tensors[1:]:
        if op == dist.ReduceOp.SUM:
            acc = acc + t if acc.dtype != torch.bool else acc | t
        elif op == dist.ReduceOp.PRODUCT:
            acc = acc * t if acc.dtype != torch.bool else acc & t
        elif op == dist.ReduceOp.MAX:
            acc = torch.maximum(acc, t)
        elif op == dist.ReduceOp.MIN:
            acc = torch.minimum(acc, t)
        elif op == dist.ReduceOp.BAND:
            acc = acc & t
        elif op == dist.ReduceOp.BOR:
            acc = acc | t
        elif op == dist.ReduceOp.BXOR:
            acc = acc ^ t
    return acc.to(tensors[0].dtype)


def ops_for(dtype):
    if dtype in (torch.complex64, torch.complex128):
        return [dist.ReduceOp.SUM]
    ops = [dist.ReduceOp.SUM, dist.ReduceOp.PRODUCT, dist.ReduceOp.MAX, dist.ReduceOp.MIN]
    if dtype in INT_DTYPES or dtype == torch.bool:
        ops += [dist.ReduceOp.BAND, dist.ReduceOp.BOR, dist.ReduceOp.BXOR]
    if dtype == torch.bool:
        ops = [o for o in ops if o not in (dist.ReduceOp.SUM, dist.ReduceOp.PRODUCT)] + [dist.ReduceOp.SUM]
    return ops


def same(a, b, what):
    if a.dtype in (torch.float16, torch.bfloat16):
        ok = torch.allclose(a.double(), b.double(), rtol=1e-2, atol=1e-2)
    else:
        ok = torch.equal(a, b)
    if not ok:
        raise AssertionError(f"{what}: got {a.tolist()} expected {b.tolist()}")


def case_ops(ranks_in_group=None):
    """Every collective x dtype x op on the world and on a sub-group, against the serial reference."""
    rank, size = init()
    groups = [(None, list(range(size)))]
    if size >= 3:
        sub = [r for r in range(size) if r != 1]
        groups.append((dist.new_group(sub), sub))
    checks = 0
    for group, members in groups:
        if rank not in members:
            continue
        me, gsize = members.index(rank), len(members)
        for dtype in DTYPES:
            n = 5
            inputs = [value(r, n, dtype) for r in members]
            for op in ops_for(dtype):
                t = inputs[me].clone()
                dist.all_reduce(t, op=op, group=group)
                same(t, reference(op, inputs), f"all_reduce {op} {dtype}")
                for root in (0, gsize - 1):
                    t = inputs[me].clone()
                    dist.reduce(t, members[root], op=op, group=group)
                    same(t, reference(op, inputs) if me == root else inputs[me], f"reduce {op} {dtype} root {root}")
                out = torch.empty_like(inputs[me])
                ins = [value(members[me], n, dtype, salt=j) for j in range(gsize)]
                dist.reduce_scatter(out, ins, op=op, group=group)
                same(out, reference(op, [value(r, n, dtype, salt=me) for r in members]), f"reduce_scatter {op} {dtype}")
                checks += 3
            # data movement
            for root in (0, gsize - 1):
                t = inputs[me].clone() if me == root else torch.zeros_like(inputs[me])
                dist.broadcast(t, members[root], group=group)
                same(t, inputs[root], f"broadcast {dtype}")
            outs = [torch.zeros_like(inputs[me]) for _ in members]
            dist.all_gather(outs, inputs[me], group=group)
            for j in range(gsize):
                same(outs[j], inputs[j], f"all_gather {dtype}")
            flat = torch.zeros(gsize * n, dtype=dtype)
            dist.all_gather_into_tensor(flat, inputs[me], group=group) if hasattr(dist, "all_gather_into_tensor") \
                else dist._all_gather_base(flat, inputs[me], group=group)
            same(flat, torch.cat(inputs), f"all_gather_into_tensor {dtype}")
            root = gsize - 1
            outs = [torch.zeros_like(inputs[me]) for _ in members] if me == root else None
            dist.gather(inputs[me], outs, dst=members[root], group=group)
            if me == root:
                for j in range(gsize):
                    same(outs[j], inputs[j], f"gather {dtype}")
            out = torch.zeros_like(inputs[me])
            scat = [value(members[root], n, dtype, salt=10 + j) for j in range(gsize)] if me == root else None
            dist.scatter(out, scat, src=members[root], group=group)
            same(out, value(members[root], n, dtype, salt=10 + me), f"scatter {dtype}")
            # uneven all_to_all: rank i sends i+j+1 rows to rank j
            send = [value(rank, me + j + 1, dtype, salt=j) for j in range(gsize)]
            recv = [torch.zeros(j + me + 1, dtype=dtype) for j in range(gsize)]
            dist.all_to_all(recv, send, group=group)
            for j in range(gsize):
                same(recv[j], value(members[j], j + me + 1, dtype, salt=me), f"all_to_all {dtype} from {j}")
            ins = torch.cat(send)
            out = torch.zeros(sum(j + me + 1 for j in range(gsize)), dtype=dtype)
            dist.all_to_all_single(out, ins, [j + me + 1 for j in range(gsize)],
                                   [me + j + 1 for j in range(gsize)], group=group)
            same(out, torch.cat(recv), f"all_to_all_single uneven {dtype}")
            checks += 8
        # non-contiguous tensors, written through
        t = torch.arange(12, dtype=torch.float32).reshape(3, 4).t() * (me + 1)
        dist.all_reduce(t, group=group)
        same(t, torch.arange(12, dtype=torch.float32).reshape(3, 4).t() * (gsize * (gsize + 1) // 2), "non-contiguous")
        dist.barrier(group=group)
        checks += 2
    # coalesced
    ts = [torch.full((3,), float(rank)), torch.full((2,), float(rank + 1))]
    dist.all_reduce_coalesced(ts)
    same(ts[0], torch.full((3,), float(sum(range(size)))), "all_reduce_coalesced 0")
    same(ts[1], torch.full((2,), float(sum(range(1, size + 1)))), "all_reduce_coalesced 1")
    print(f"OK ops checks={checks + 2} rank={rank}", flush=True)


def case_async():
    """async_op collectives overlap, futures carry the outputs, p2p in both orders, tags and any source."""
    rank, size = init()
    works = []
    ts = [torch.full((1000,), float(rank + i)) for i in range(8)]
    for t in ts:
        works.append(dist.all_reduce(t, async_op=True))
    fut = works[-1].get_future()
    for w in works:
        w.wait()
        assert w.is_completed()
    val = fut.wait()
    assert isinstance(val, list) and val[0] is ts[-1], "the future's value is the list of output tensors"
    for i, t in enumerate(ts):
        same(t, torch.full((1000,), float(sum(r + i for r in range(size)))), f"async all_reduce {i}")
    # a synchronous call posted behind asynchronous ones runs after them (the calling thread runs it
    # itself only when the group is idle): a wrong order would pair a MAX of 4 with a SUM of 64 Ki
    big = [torch.full((1 << 16,), float(rank + i)) for i in range(4)]
    works = [dist.all_reduce(t, async_op=True) for t in big]
    small = torch.full((4,), float(rank))
    dist.all_reduce(small, op=dist.ReduceOp.MAX)
    same(small, torch.full((4,), float(size - 1)), "sync all_reduce behind async ones")
    for i, (t, w) in enumerate(zip(big, works)):
        w.wait()
        same(t, torch.full((1 << 16,), float(sum(r + i for r in range(size)))), f"async all_reduce {i} before a sync")
    chained = dist.all_reduce(torch.ones(2), async_op=True).get_future().then(lambda f: f.value()[0] * 2)
    same(chained.wait(), torch.full((2,), 2.0 * size), "future.then")
    # irecv before isend on every rank (ring): must not deadlock
    right, left = (rank + 1) % size, (rank - 1) % size
    for big in (4, 3 << 20):  # small, and bigger than a shared-memory ring
        got = torch.zeros(big)
        r = dist.irecv(got, left, tag=7)
        s = dist.isend(torch.full((big,), float(rank)), right, tag=7)
        s.wait()
        r.wait()
        same(got, torch.full((big,), float(left)), f"ring {big}")
    # tags: two messages from the same peer, received in the opposite tag order
    if rank == 0:
        a, b = torch.zeros(1), torch.zeros(1)
        wb = dist.irecv(b, 1, tag=2)
        wa = dist.irecv(a, 1, tag=1)
        wa.wait()
        wb.wait()
        assert a.item() == 1.0 and b.item() == 2.0, (a, b)
    elif rank == 1:
        dist.send(torch.ones(1), 0, tag=1)
        dist.send(torch.full((1,), 2.0), 0, tag=2)
    # receive from any source: rank 0 hears from everyone else
    if rank == 0:
        seen = []
        for _ in range(size - 1):
            t = torch.zeros(2)
            src = dist.recv(t, tag=9)
            same(t, torch.full((2,), float(src * 10)), "any source payload")
            seen.append(src)
        assert sorted(seen) == list(range(1, size)), seen
        w = dist.irecv(torch.zeros(2), tag=10)  # irecv from any source
        w.wait()
        assert w._source_rank() == 1, w._source_rank()
    else:
        dist.send(torch.full((2,), float(rank * 10)), 0, tag=9)
        if rank == 1:
            dist.send(torch.full((2,), 10.0), 0, tag=10)
    dist.barrier()
    print(f"OK async rank={rank}", flush=True)


def case_ddp(backend):
    """A small MLP under DDP: prints the parameters after 5 steps (the test compares dcomm with gloo)."""
    rank, size = init(backend)
    torch.manual_seed(1234)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    ddp = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=0.001)  # several buckets
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    gen = torch.Generator().manual_seed(99)
    for _ in range(5):
        x = torch.randn(size * 8, 16, generator=gen)[rank * 8:(rank + 1) * 8]
        y = torch.randn(size * 8, 4, generator=gen)[rank * 8:(rank + 1) * 8]
        opt.zero_grad()
        torch.nn.functional.mse_loss(ddp(x), y).backward()
        opt.step()
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()]).double()
    allp = [torch.zeros_like(flat) for _ in range(size)]
    dist.all_gather(allp, flat)
    assert all(torch.equal(allp[0], p) for p in allp), "parameters differ across ranks"
    print(f"OK ddp rank={rank} params={','.join(repr(v) for v in flat.tolist())}", flush=True)


def case_errors():
    """Bad input fails with a clear error; mismatched collectives name the mismatch; the group still works."""
    rank, size = init()
    try:
        dist.all_gather([torch.zeros(2)], torch.zeros(2))  # too few outputs
        raise AssertionError("a short output list was accepted")
    except (ValueError, RuntimeError) as e:
        assert "tensor" in str(e).lower() or "output" in str(e).lower(), e
    try:
        dist.all_reduce(torch.zeros(2), op=dist.ReduceOp.BAND)
        raise AssertionError("BAND on float was accepted")
    except dcomm.InvalidArgument as e:
        assert "integer" in str(e), e
    # a tensor on a device dcomm cannot address (a meta tensor stands in for any non-CPU device here):
    # refused before anything is sent, naming the device, on every collective and on send
    for what, call in (("all_reduce", lambda m: dist.all_reduce(m)), ("broadcast", lambda m: dist.broadcast(m, 0)),
                       ("all_gather_into_tensor", lambda m: dist.all_gather_into_tensor(m, torch.zeros(2))),
                       ("send", lambda m: dist.send(m, (rank + 1) % size))):
        try:
            call(torch.zeros(2 * size, device="meta"))
            raise AssertionError(f"{what}: a meta tensor was accepted")
        except dcomm.InvalidArgument as e:
            assert "device 'meta'" in str(e) and "CPU tensors" in str(e), f"{what}: {e}"
    t = torch.ones(4)
    dist.all_reduce(t)  # still usable
    same(t, torch.full((4,), float(size)), "all_reduce after bad input")
    # mismatch: rank 0 reduces 4 floats, the others 5. The exception itself is reported (class, code,
    # name, message) for test_backend.py to check; the OK line's words alone prove nothing.
    try:
        dist.all_reduce(torch.ones(4 if rank == 0 else 5))
        raise AssertionError("mismatched counts were accepted")
    except dcomm.Error as e:
        print(f"OK errors rank={rank} class={type(e).__name__} code={e.code} name={e.name} "
              f"message={str(e)!r}", flush=True)


def case_rs_avg():
    """reduce_scatter_tensor / _reduce_scatter_base (gloo has neither) and ReduceOp.AVG (gloo refuses it in
    torch 1.13) on the world and on a sub-group, against the serial reference."""
    import warnings
    rank, size = init()
    groups = [(None, list(range(size)))]
    if size >= 3:
        sub = [r for r in range(size) if r != 1]
        groups.append((dist.new_group(sub), sub))
    checks = 0
    for group, members in groups:
        if rank not in members:
            continue
        me, gsize, n = members.index(rank), len(members), 3
        for dtype in (torch.float32, torch.float64, torch.bfloat16, torch.int32, torch.int16, torch.uint8,
                      torch.complex64):
            for op in ([dist.ReduceOp.SUM, dist.ReduceOp.AVG] if dtype.is_complex else
                       [dist.ReduceOp.SUM, dist.ReduceOp.MAX, dist.ReduceOp.AVG]):
                # rank r's input is gsize chunks of n; chunk j goes to member j
                chunks = {r: [value(r, n, dtype, salt=j) for j in range(gsize)] for r in members}
                want = reference(dist.ReduceOp.SUM if op == dist.ReduceOp.AVG else op,
                                 [chunks[r][me] for r in members])
                if op == dist.ReduceOp.AVG:
                    want = (want / gsize if dtype.is_floating_point or dtype.is_complex
                            else torch.div(want, gsize, rounding_mode="trunc")).to(dtype)
                out = torch.full((n,), 99).to(dtype)
                dist.reduce_scatter_tensor(out, torch.cat(chunks[rank]), op=op, group=group)
                same(out, want, f"reduce_scatter_tensor {op} {dtype}")
                # stacked and not contiguous: a [gsize, n] view of an [n, gsize] tensor
                stacked = torch.stack(chunks[rank], dim=1).t()
                assert not stacked.is_contiguous()
                out = torch.zeros(n, dtype=dtype)
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")  # "_reduce_scatter_base is a private function"
                    dist._reduce_scatter_base(out, stacked, op=op, group=group)
                same(out, want, f"_reduce_scatter_base {op} {dtype}")
                checks += 2
            ins = [value(r, n, dtype) for r in members]
            t = ins[me].clone()
            dist.all_reduce(t, op=dist.ReduceOp.AVG, group=group)
            total = reference(dist.ReduceOp.SUM, ins)
            want = (total / gsize if dtype.is_floating_point or dtype.is_complex
                    else torch.div(total, gsize, rounding_mode="trunc")).to(dtype)
            same(t, want, f"all_reduce AVG {dtype}")
            t = ins[me].clone()
            dist.reduce(t, members[-1], op=dist.ReduceOp.AVG, group=group)
            same(t, want if me == gsize - 1 else ins[me], f"reduce AVG {dtype}")
            checks += 2
        # AVG is not an average of sums: 1..gsize over gsize ranks gives (gsize+1)/2, not the sum
        t = torch.tensor([float(me + 1)])
        dist.all_reduce(t, op=dist.ReduceOp.AVG, group=group)
        assert t.item() == (gsize + 1) / 2, t
        # bool has no average: refused with dcomm's error, the group still works
        try:
            dist.all_reduce(torch.ones(2, dtype=torch.bool), op=dist.ReduceOp.AVG, group=group)
            raise AssertionError("ReduceOp.AVG on bool was accepted")
        except dcomm.InvalidArgument as e:
            assert "AVG" in str(e) and "bool" in str(e), e
        # a wrongly sized input is refused at the call
        try:
            dist.reduce_scatter_tensor(torch.zeros(2), torch.zeros(2 * gsize + 1), group=group)
            raise AssertionError("a reduce_scatter_tensor input of the wrong size was accepted")
        except dcomm.InvalidArgument as e:
            assert "needs" in str(e), e
        dist.barrier(group=group)
        checks += 3
    print(f"OK rs_avg checks={checks} rank={rank}", flush=True)


def case_monitored_barrier():
    """torch 1.13's dist.monitored_barrier refuses every backend but gloo; the process group's own
    monitored_barrier passes when every rank comes, and when the last rank stays away every other
    rank's fails with dcomm.TimedOut within its timeout, naming the absent rank (rank 0's does)."""
    from datetime import timedelta
    rank, size = init()
    try:
        dist.monitored_barrier(timeout=timedelta(seconds=5))
        raise AssertionError("dist.monitored_barrier accepted a backend other than gloo (update dcomm_torch(7))")
    except RuntimeError as e:
        assert "GLOO" in str(e) and not isinstance(e, dcomm.Error), repr(e)
    pg = dist.distributed_c10d._get_default_group()
    store = dist.distributed_c10d._get_default_store()
    pg.monitored_barrier(timedelta(seconds=20))
    absent = size - 1
    if rank == absent:  # stays alive (a dead rank would be PeerLost) until the others have timed out
        store.wait([f"mb/{r}" for r in range(size - 1)], timedelta(seconds=60))
        store.set("mb/absent", "1")  # rank 0 (the store's host under env://) may exit now
        print(f"OK monitored_barrier rank={rank} absent", flush=True)
        return
    t0 = time.monotonic()
    try:
        pg.monitored_barrier(timedelta(seconds=1.5))
        raise AssertionError("monitored_barrier passed without every rank")
    except dcomm.TimedOut as e:
        took = time.monotonic() - t0
        assert 1.0 <= took < 20, took
        assert rank != 0 or f"rank {absent}" in str(e), e
        print(f"OK monitored_barrier rank={rank} timed_out after={took:.2f} error={e}", flush=True)
    finally:
        store.set(f"mb/{rank}", "1")
        store.wait(["mb/absent"], timedelta(seconds=60))


def case_launch():
    """Run by a launcher (torchrun, in test_launchers.py): the default group on dcomm, an all_reduce and
    sub-groups, checked on every rank."""
    rank, size = init()
    assert size == int(os.environ["WORLD_SIZE"]) and rank == int(os.environ["RANK"]), (rank, size)
    assert dist.get_backend() == "dcomm", dist.get_backend()
    t = torch.full((4,), float(rank + 1))
    dist.all_reduce(t)
    same(t, torch.full((4,), float(size * (size + 1) // 2)), "all_reduce")
    low = dist.new_group([0, 1])
    solo = dist.new_group([size - 1])
    if rank in (0, 1):
        t = torch.tensor([float(10 ** rank)])
        dist.all_reduce(t, group=low)
        same(t, torch.tensor([11.0]), "all_reduce on new_group([0, 1])")
    if rank == size - 1:
        t = torch.tensor([5.0])
        dist.all_reduce(t, group=solo)
        same(t, torch.tensor([5.0]), "all_reduce on a one-rank group")
    got = [torch.zeros(1) for _ in range(size)]
    dist.all_gather(got, torch.tensor([float(rank)]))
    same(torch.cat(got), torch.arange(size, dtype=torch.float32), "all_gather")
    dist.barrier()
    print(f"OK launch rank={rank} world={size} torchelastic={os.environ.get('TORCHELASTIC_RUN_ID', '-')}",
          flush=True)


def case_peer_dies():
    """Rank size-1 exits mid-job; every survivor's next collective raises a recoverable dcomm.Error quickly."""
    rank, size = init()
    dist.all_reduce(torch.ones(4))
    if rank == size - 1:
        os._exit(3)
    t0 = time.monotonic()
    try:
        for _ in range(100):
            dist.all_reduce(torch.ones(1 << 16))
        raise AssertionError("collectives went on after a rank died")
    except dcomm.Error as e:
        assert dcomm.torch.is_recoverable(e), repr(e)
        print(f"OK peer_dies rank={rank} error={type(e).__name__} after={time.monotonic() - t0:.3f}", flush=True)


if __name__ == "__main__":
    case = sys.argv[1]
    globals()["case_" + case](*sys.argv[2:])
    if case != "peer_dies":
        dist.destroy_process_group()
