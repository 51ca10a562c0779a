"""Row softmax, ``y = exp(x - max(x)) / sum(exp(x - max(x)))`` in f32: one warp per row.

Each of the ``B`` CTAs is one warp that owns one row; every lane keeps its
``N / 32`` elements in registers (strided by 32 for coalescing). The row
maximum and the sum of exponentials come from butterfly-shuffle reductions;
``exp(x - m)`` is ``ex2.approx((x - m) * log2(e))`` with the scaling folded
into one ``fma``, and the normalization multiplies by ``rcp.approx`` of the
sum. ``N`` must be a multiple of 32; large ``N`` spills registers.

    python -m pyptx_kernels.rows.softmax [B] [N]
"""

import math

from pyptx import SpecError, Tile, kernel
from pyptx import rows as rw
from pyptx.types import f32, u64
from pyptx_kernels.rows.config import (
    DEFAULT_ARCH,
    SOFTMAX_CONFIGS,
    RowConfig,
    persistent_maxnreg,
    tuned,
)

WARP_SIZE = 32
LOG2E = 1.0 / math.log(2.0)


def build_softmax(B: int, N: int):
    """The kernel taking the softmax of each row of a ``(B, N)`` f32 matrix."""
    if N % WARP_SIZE:
        raise SpecError(f"build_softmax: N must be a multiple of {WARP_SIZE}, got {N}")
    items = N // WARP_SIZE
    stride = WARP_SIZE * 4

    @kernel(
        in_specs=(Tile(B, N, f32),),
        out_specs=(Tile(B, N, f32),),
        grid=(B, 1, 1),
        block=(WARP_SIZE, 1, 1),
    )
    def softmax(X, Y):
        from pyptx import ptx, reg  # the tracing layer: loaded at the first trace
        px, py = ptx.global_ptrs(X, Y)
        off = reg.scalar(u64)
        ptx.inst.mul.wide.u32(off, ptx.special.ctaid.x(), N * 4)
        ptx.inst.mad.wide.u32(off, ptx.special.tid.x(), 4, off)
        px += off
        py += off

        x = reg.array(f32, items)
        for i in range(items):
            ptx.inst.ld.global_.f32(x[i], ptx.addr(px, i * stride))
        m = reg.scalar(f32, init=x[0])
        for i in range(1, items):
            ptx.inst.max.f32(m, m, x[i])
        ptx.warp.reduce_max(m)

        neg_m = reg.scalar(f32)
        ptx.inst.mul.f32(neg_m, m, -LOG2E)
        total = reg.scalar(f32, init=0.0)
        for i in range(items):
            ptx.inst.fma.rn.f32(x[i], x[i], LOG2E, neg_m)
            ptx.inst.ex2.approx.ftz.f32(x[i], x[i])
            total += x[i]
        ptx.warp.reduce_sum(total)

        inv = reg.scalar(f32)
        ptx.inst.rcp.approx.ftz.f32(inv, total)
        for i in range(items):
            ptx.inst.mul.f32(x[i], x[i], inv)
            ptx.inst.st.global_.f32(ptx.addr(py, i * stride), x[i])
        ptx.ret()

    return softmax


@tuned("softmax", SOFTMAX_CONFIGS)
def build_softmax_fast(B: int, N: int, dtype=f32, *, config: RowConfig | None = None,
                       arch: str = DEFAULT_ARCH):
    """Row softmax at the bandwidth ceiling, ``(B, N)`` f32 or bf16 in and out, f32 math.

    One pass: each thread loads its ``K`` 16-byte chunks of the row
    (plain ``ld.global``, all in flight at once; the masked tail
    reads as ``-inf``), takes the maximum (tree, then an all-reduce over the
    row's threads: shuffles, plus shared memory and one ``bar.sync`` when the
    row has several warps), turns the registers into ``ex2.approx((x - m) *
    log2 e)`` with one ``fma`` each, all-reduces their sum the same way and
    writes ``e * rcp.approx(sum)`` with 16-byte stores. Nothing is re-read.
    Short rows share a CTA; the launch shape comes from ``pyptx.rows.plan_rows`` (the
    config's ``chunks``/``threads``/``rows`` override it).

    Called without ``config``, it returns a ``pyptx.autotune.TunedKernel``: at its first
    launch on a device it times the ``SOFTMAX_CONFIGS`` that build, assemble and do not
    spill, on the call's arguments, and keeps the fastest (on disk too). With a
    ``RowConfig`` (plan ``"row"`` or ``"persistent"``) it builds exactly that plan.

    ``ctas=P`` builds the persistent variant instead: ``min(P, ceil(B/R))`` CTAs,
    each walking rows ``cta*R, cta*R + P*R, ...`` in a device loop with the next
    row's loads issued before this row's reductions, barriers and stores (two
    register sets, ``pyptx.rows.row_loop``). Its shape aims at 16 values per thread
    (2048x8192: 512 threads x 4 chunks f32, x 2 bf16), at most 64 registers: two
    CTAs per SM, so ``P`` = 2 x the SM count (264 on an H100) fills the GPU once.
    ``maxnreg`` adds ``.maxnreg`` (either variant).

    ``pdl`` (default True) launches with programmatic dependent launch: the kernel is
    scheduled during the previous kernel's last wave, its address setup and an L2
    prefetch of its rows (``cp.async.bulk.prefetch``) run before ``griddepcontrol.wait``,
    and nothing is read or written before the previous grid has finished.

    The config's cache hints (``RowConfig.hints``) each change the PTX; the defaults are the
    measured best.

    Supported: any ``B >= 1``, ``1 <= N <= 32768`` (persistent: ``N <= 16384``).
    Tolerance against float64: relative L2 error below 1e-5 for f32, 1e-2 for
    bf16.
    """
    dt = rw.dtype_of(dtype, "build_softmax_fast")
    return _KERNELS[config.plan](B, N, dt, config, arch)


def _softmax_row(B, N, dt, c, arch):
    """The one-row kernel (``RowConfig`` plan ``"row"``)."""
    plan = rw.plan_rows(B, N, dt, who="build_softmax_fast", chunks=c.chunks, threads=c.threads,
                        rows=c.rows)
    hints, pdl = c.hints, c.pdl

    @kernel(
        in_specs=(Tile(B, N, dt),),
        out_specs=(Tile(B, N, dt),),
        grid=plan.grid,
        block=plan.block,
        name=f"softmax_{dt.name}",
        arch=arch,
        maxnreg=c.maxnreg,
        pdl=pdl,
    )
    def softmax_fast(X, Y):
        from pyptx import ptx  # the tracing layer: loaded at the first trace
        with rw.entry(pdl):
            px, py = ptx.global_ptrs(X, Y)
            io = rw.Rows(plan, hints)
            if pdl:
                io.prefetch_rows(px)
        row, ok = io.locate(io.first_row())
        off = io.offset(row)
        e, inv = _softmax_exp(io, io.load(px + off, fill=rw.NEG_INF))
        io.store(py + off, rw.mul_all(e, inv), ok)
        ptx.ret()

    softmax_fast.plan = plan
    return softmax_fast


def _softmax_exp(io, x, *, lanes=False):
    """``(exp(x - max), 1 / sum of them)`` for a row held as ``x`` across the row's threads."""
    from pyptx import ptx, reg  # the tracing layer: loaded at the first trace
    m = rw.tree(x, "max")
    io.reduce([m], "max", lanes=lanes)
    nm = reg.scalar(f32)
    ptx.inst.mul.f32(nm, m, -LOG2E)
    e = []
    for v in x:
        r = reg.scalar(f32)
        ptx.inst.fma.rn.f32(r, v, LOG2E, nm)
        ptx.inst.ex2.approx.ftz.f32(r, r)
        e.append(r)
    s = rw.tree(e, "add")
    io.reduce([s], lanes=lanes)
    inv = reg.scalar(f32)
    ptx.inst.rcp.approx.ftz.f32(inv, s)
    return e, inv


def _softmax_persistent(B, N, dt, c, arch):
    """Plan ``"persistent"`` (``ctas=P``): ``P`` CTAs walk the rows (``pyptx.rows.row_loop``),
    the next row's loads in flight while this row reduces and stores."""
    who = f"build_softmax_fast(ctas={c.ctas!r})"
    plan = rw.persistent_plan(B, N, dt, who=who, elems=16, chunks=c.chunks, threads=c.threads,
                              rows=c.rows)
    P = rw.persistent_ctas(plan, c.ctas, who)
    hints = c.hints

    @kernel(
        in_specs=(Tile(B, N, dt),),
        out_specs=(Tile(B, N, dt),),
        grid=(P, 1, 1),
        block=plan.block,
        name=f"softmax_persist_{dt.name}",
        arch=arch,
        maxnreg=persistent_maxnreg(c, plan, arch),
        pdl=c.pdl,
    )
    def softmax_persist(X, Y):
        from pyptx import ptx  # the tracing layer: loaded at the first trace
        px, py = ptx.global_ptrs(X, Y)
        io = rw.Rows(plan, hints)

        def fetch(off, guard, dst):
            return io.load_raw(px + off, fill=rw.NEG_INF, guard=guard, dst=dst, cache=rw.PINNED)

        def body(raw, off, ok):
            e, inv = _softmax_exp(io, io.unpack(raw), lanes=True)
            io.store(py + off, rw.mul_all(e, inv), ok)

        rw.row_loop(io, fetch, body)
        ptx.ret()

    softmax_persist.plan = plan
    softmax_persist.ctas = P
    return softmax_persist


_KERNELS = {"row": _softmax_row, "persistent": _softmax_persistent}


def reference(x):
    """Softmax of each row of a list of rows, in Python floats."""
    out = []
    for row in x:
        m = max(row)
        e = [math.exp(v - m) for v in row]
        s = sum(e)
        out.append([v / s for v in e])
    return out


def main(argv=None) -> int:
    """Check on a GPU, or print the ptxas report."""
    from pyptx.testing import parse_args, run_example

    a = parse_args(__doc__.splitlines()[0], argv, B=64, N=1024)

    def make_inputs(torch):
        return (torch.randn(a["B"], a["N"], device="cuda") * 3.0,)

    return run_example(build_softmax(a["B"], a["N"]), make_inputs, reference,
                       atol=1e-6, rtol=1e-5)


if __name__ == "__main__":
    raise SystemExit(main())
