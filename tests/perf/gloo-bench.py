"""gloo-bench.py: torch.distributed's gloo backend timed the way dcomm-bench
times dcomm, for tests/perf/compare-mpi.sh's third side.

Run on every rank under a launcher that sets torchrun's variables (RANK,
WORLD_SIZE, MASTER_ADDR, MASTER_PORT):

    dcomm-run --quiet-prefix --nproc-per-node 2 -- \\
        python3 tests/perf/gloo-bench.py -o all_reduce -b 8 -e 64M -f 4 -d float32 -n 20 -w 5

The flags are dcomm-bench's (tools/bench_util.c): -o all_reduce (default),
all_gather, broadcast, all_to_all; -b MIN (default 8) and -e MAX (default
8M) in bytes with K/M/G suffixes; -f FACTOR (default 2); -d DTYPE (float32
by default; int8 uint8 int32 int64 float16 float64 too; uint32 and uint64
have no torch 1.13 dtype and gloo's all_reduce refuses bfloat16 there
("Invalid scalar type"), so those three are usage errors); -n ITERS (20);
-w WARMUP (5); -c 0|1 (check, default 1). The sizes, the measurement and the rows are dcomm-bench's: per
size, one checked call, WARMUP calls, a barrier, ITERS calls back to back;
the time is the mean per call of the slowest rank (an all_reduce MAX of the
per-rank means), and rank 0 prints

    size count type time_us algbw_GBps busbw_GBps errors

where size is the per-rank buffer in bytes as nccl-tests (and dcomm-bench)
define it: the whole buffer for all_reduce and broadcast, the gathered
output for all_gather, the input for all_to_all; count is the elements per
rank that the call takes (all_gather and all_to_all: the size divided by
the world size, rounded down, so the size is a multiple of world size *
element size; a size under one element per rank is skipped). busbw uses
nccl-tests' factors; errors counts the wrong elements over all ranks after
the checked call, against dcomm-bench's integer-valued input pattern.
The calls: dist.all_reduce (SUM, in place), dist.all_gather into views of
one output tensor, dist.broadcast (root 0), dist.all_to_all_single (gloo
has no list all_to_all). gloo on torch 1.13 has no reduce_scatter on CPU:
-o reduce_scatter prints no row (a line on stderr says why) and exits 0.

Exit status: 0 success, 1 a wrong result, 2 a usage error.
"""
import os
import sys
import time

OPS = ("all_reduce", "all_gather", "broadcast", "reduce_scatter", "all_to_all")
# name: (torch dtype attribute, bytes, exact-integer limit), as bench_util.c's table.
DTYPES = {
    "int8": ("int8", 1, 127),
    "uint8": ("uint8", 1, 255),
    "int32": ("int32", 4, 2147483647.0),
    "int64": ("int64", 8, 9.0e15),
    "float16": ("float16", 2, 2048),
    "float32": ("float32", 4, 16777216),
    "float64": ("float64", 8, 9.0e15),
}
ALIASES = {"char": "int8", "int": "int32", "float": "float32", "double": "float64", "half": "float16",
           "fp16": "float16", "fp32": "float32", "fp64": "float64"}
USAGE = ("usage: gloo-bench.py [-o OP] [-b MIN] [-e MAX] [-f FACTOR] [-d DTYPE] [-n ITERS] [-w WARMUP] [-c 0|1]\n"
         "  OP: all_reduce (default), all_gather, broadcast, all_to_all (reduce_scatter: no rows, gloo lacks it)\n"
         "  DTYPE: int8 uint8 int32 int64 float16 float32 (default) float64\n")


def usage_error(msg):
    if int(os.environ.get("RANK", "0") or 0) <= 0:
        sys.stderr.write(f"gloo-bench: {msg}\n{USAGE}")
    sys.exit(2)


def parse_size(s, flag):
    """Unsigned decimal with an optional K, M or G (powers of 1024) suffix and B."""
    t = s
    if t[-1:] in ("B", "b"):
        t = t[:-1]
    shift = {"k": 10, "m": 20, "g": 30}.get(t[-1:].lower(), 0)
    if shift:
        t = t[:-1]
    if not t.isdigit():
        usage_error(f"bad size '{s}' for {flag}")
    return int(t) << shift


def parse_args(argv):
    o = {"op": "all_reduce", "dtype": "float32", "minb": 8, "maxb": 8 << 20, "factor": 2, "iters": 20,
         "warmup": 5, "check": 1}
    i = 0
    while i < len(argv):
        a = argv[i]
        if a in ("-h", "--help"):
            sys.stdout.write(USAGE)
            sys.exit(0)
        if len(a) != 2 or a[0] != "-":
            usage_error(f"unknown argument '{a}'")
        if i + 1 >= len(argv):
            usage_error(f"{a} needs a value")
        v = argv[i + 1]
        i += 2
        f = a[1]
        if f == "o":
            if v not in OPS:
                usage_error(f"unknown operation '{v}' (-o)")
            o["op"] = v
        elif f == "d":
            v = ALIASES.get(v, v)
            if v not in DTYPES:
                usage_error(f"unknown dtype '{v}' (-d)")
            o["dtype"] = v
        elif f == "b":
            o["minb"] = parse_size(v, "-b")
        elif f == "e":
            o["maxb"] = parse_size(v, "-e")
        elif f == "f":
            o["factor"] = parse_size(v, "-f")
        elif f in ("n", "w", "c"):
            if not v.isdigit():
                usage_error(f"{a} needs a non-negative integer")
            o[{"n": "iters", "w": "warmup", "c": "check"}[f]] = int(v)
        else:
            usage_error(f"unknown option '{a}'")
    if o["minb"] < 1 or o["maxb"] < 1:
        usage_error("sizes are bytes >= 1")
    if o["factor"] < 1 or o["iters"] < 1 or o["check"] > 1:
        usage_error("bad value for -f, -n or -c")
    if o["minb"] > o["maxb"]:
        usage_error("-b is larger than -e")
    if o["factor"] == 1 and o["minb"] != o["maxb"]:
        usage_error("-f 1 needs -b equal to -e")
    return o


def main():
    o = parse_args(sys.argv[1:])
    import torch
    import torch.distributed as dist

    op = o["op"]
    if op == "reduce_scatter":
        if int(os.environ.get("RANK", "0") or 0) == 0:
            sys.stderr.write(f"gloo-bench: gloo has no reduce_scatter on CPU (torch {torch.__version__}): no rows\n")
        return 0
    tname, es, exact = DTYPES[o["dtype"]]
    dt = getattr(torch, tname)
    dist.init_process_group("gloo", init_method="env://")
    rank, n = dist.get_rank(), dist.get_world_size()

    mod = 1021 if exact / n >= 1021 else int(exact / n) if exact / n >= 1 else 1

    def pat(r, k0, cnt):
        """Elements k0 .. k0+cnt-1 of rank r's pattern, as float64 (exact integers)."""
        k = torch.arange(k0, k0 + cnt, dtype=torch.int64)
        return ((k * 7 + r * 13 + 1) % mod).to(torch.float64)

    def sum_pat(k0, cnt):
        s = torch.zeros(cnt, dtype=torch.float64)
        for r in range(n):
            s += pat(r, k0, cnt)
        return s

    if rank == 0:
        print(f"# gloo-bench (torch {torch.__version__}, backend gloo)")
        print(f"# op {op}  dtype {o['dtype']}  redop {'sum' if op == 'all_reduce' else 'none'}  world size {n}  "
              f"group size {n} (1 group)  iters {o['iters']}  warmup {o['warmup']}  check {o['check']}")
        print("#%11s %13s %9s %12s %11s %11s %7s" % ("size", "count", "type", "time_us", "algbw_GBps", "busbw_GBps",
                                                    "errors"), flush=True)
    bus = {"all_reduce": 2.0 * (n - 1) / n, "broadcast": 1.0}.get(op, (n - 1) / n)
    total_errors = 0
    busbw_sum = 0.0
    rows = 0
    prev_size = -1
    b = o["minb"]
    while True:
        elems = b // es
        count = elems if op in ("all_reduce", "broadcast") else elems // n
        size = count * es if op in ("all_reduce", "broadcast") else count * n * es
        if count == 0:
            if rank == 0:
                print(f"# {b} bytes: less than one element per rank, skipped", flush=True)
        elif size != prev_size:
            prev_size = size
            # The buffers and the call, the result buffer filled with this
            # rank's values too (so a call that does not write it is caught).
            if op in ("all_reduce", "broadcast"):
                rbuf = pat(rank, 0, count).to(dt)
                if op == "all_reduce":
                    def call():
                        dist.all_reduce(rbuf, op=dist.ReduceOp.SUM)
                else:
                    def call():
                        dist.broadcast(rbuf, src=0)
            elif op == "all_gather":
                sbuf = pat(rank, 0, count).to(dt)
                rbuf = pat(rank, count, count * n).to(dt)
                outs = list(rbuf.split(count))

                def call():
                    dist.all_gather(outs, sbuf)
            else:  # all_to_all
                sbuf = pat(rank, 0, count * n).to(dt)
                rbuf = pat(rank, 1, count * n).to(dt)

                def call():
                    dist.all_to_all_single(rbuf, sbuf)
            errs = "N/A"
            if o["check"]:
                call()
                got = rbuf.to(torch.float64)
                if op == "all_reduce":
                    want = sum_pat(0, count)
                elif op == "broadcast":
                    want = pat(0, 0, count)
                elif op == "all_gather":
                    want = torch.cat([pat(j, 0, count) for j in range(n)])
                else:
                    want = torch.cat([pat(j, rank * count, count) for j in range(n)])
                bad = torch.tensor([int((got != want).sum())], dtype=torch.int64)
                dist.all_reduce(bad, op=dist.ReduceOp.SUM)
                total_errors += int(bad.item())
                errs = str(int(bad.item()))
            for _ in range(o["warmup"]):
                call()
            dist.barrier()
            t0 = time.perf_counter()
            for _ in range(o["iters"]):
                call()
            t = torch.tensor([(time.perf_counter() - t0) / o["iters"]], dtype=torch.float64)
            dist.all_reduce(t, op=dist.ReduceOp.MAX)
            t = t.item()
            algbw = size / t / 1e9
            busbw = algbw * bus
            busbw_sum += busbw
            rows += 1
            if rank == 0:
                print("%12d %13d %9s %12.2f %11.4f %11.4f %7s" % (size, count, o["dtype"], t * 1e6, algbw, busbw, errs),
                      flush=True)
        if b >= o["maxb"] or o["factor"] == 1:
            break
        b = o["maxb"] if b > o["maxb"] // o["factor"] else b * o["factor"]  # the last step is MAX itself
    if rank == 0:
        if rows:
            print(f"# avg busbw_GBps: {busbw_sum / rows:.4f}")
        print(f"# wrong elements: {total_errors}"
              + (("  FAILED" if total_errors else "") if o["check"] else " (not checked)"), flush=True)
    dist.destroy_process_group()
    return 1 if total_errors else 0


if __name__ == "__main__":
    sys.exit(main())
