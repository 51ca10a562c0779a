"""LayerNorm at the bandwidth ceiling, ``y = (x - mean) * rsqrt(var + eps) * w + b``, with backward.

``build_layer_norm`` is one pass over ``x``: each thread keeps its slice of the
row in registers (16-byte loads), the row's mean and then its variance (exact
two-pass in registers: ``mean((x - mean)**2)``) come from two all-reduces over
the row's threads, and the result is written with 16-byte stores.
``build_layer_norm_bwd`` gives ``(dx, dw, db)``; ``layer_norm_op`` wires both
through ``pyptx.differentiable_kernel``. Shared machinery: ``pyptx.rows``.

    python -m pyptx_kernels.rows.layer_norm [B] [N] [--dtype f32|bf16] [--eps EPS]
"""

from pyptx import Tile, kernel
from pyptx import rows as rw
from pyptx.errors import ConfigError
from pyptx.types import f32
from pyptx_kernels._common import where
from pyptx_kernels.rows.config import (
    DEFAULT,
    DEFAULT_ARCH,
    LAYER_NORM_CONFIGS,
    RowConfig,
    check,
    check_arch,
    persistent_maxnreg,
    tuned,
)


@tuned("layer_norm", LAYER_NORM_CONFIGS)
def build_layer_norm(B: int, N: int, dtype=f32, eps: float = 1e-5, *,
                     config: RowConfig | None = None,
                     arch: str = DEFAULT_ARCH):
    """LayerNorm over the last dim of ``X (B, N)`` with ``W (N,)``, ``Bias (N,)``, all in ``dtype``.

    f32 or bf16 storage, f32 arithmetic. Algorithm: load the row's chunks
    (plain ``ld.global``) and the weight and bias chunks
    (``ld.global.nc``), all-reduce ``sum(x)`` -> mean, form ``d = x - mean``
    (the masked tail set to 0), all-reduce ``sum(d*d)`` -> ``rstd =
    rsqrt.approx(var + eps)``, write ``d * rstd * w + b``. Launch shape from
    ``pyptx.rows.plan_rows`` (the config's ``chunks``/``threads``/``rows`` override it).

    ``welford=True`` (one-row or persistent kernel, ``N`` a multiple of the row's threads
    times their vector width): one all-reduce instead of two. Each thread takes the mean and the squared
    deviations of its own values, and ``Rows.reduce_moments`` merges the (mean, m2) pairs
    over the row (Chan et al.'s pairwise update: as stable as the second pass it replaces),
    which takes one shuffle chain and one ``bar.sync`` off the critical path of short rows.

    Called without ``config``, it returns a ``pyptx.autotune.TunedKernel``: at its first
    launch on a device it times the ``LAYER_NORM_CONFIGS`` that build, assemble and do
    not spill, on the call's arguments, and keeps the fastest (on disk too). With a
    ``RowConfig`` it builds exactly that plan.

    ``ctas=P`` builds the persistent variant instead: ``min(P, ceil(B/R))`` CTAs,
    each walking rows ``cta*R, cta*R + P*R, ...`` in a device loop with the next
    row's loads issued before this row's reductions, barriers and stores (two
    register sets, ``pyptx.rows.row_loop``); ``w`` and ``b`` are loaded once per CTA
    and kept in registers. With two weight vectors its shape aims at 8 values per
    thread (2048x8192: 1024 threads x 2 chunks f32, x 1 bf16), 64 registers: one
    1024-thread CTA per SM, so ``P`` = the SM count (132 on an H100) fills the
    GPU once. ``maxnreg`` adds ``.maxnreg`` (either variant; the one-row kernel defaults
    to 64 when a row has at least 128 threads).

    ``ctas=P, stages=S`` builds the TMA-ring variant (``pyptx.rows.Ring``): ``P`` CTAs of one
    row each step, whole rows streamed into ``S`` shared-memory slots by ``cp.async.bulk``;
    ``w`` and ``b`` read once per CTA; ``bulk_store=True`` writes ``y`` back through the slots
    with ``cp.async.bulk`` too. Needs ``N * bytes`` a multiple of 16 and ``S >= 2``.

    ``pdl`` (default True) launches with programmatic dependent launch: the kernel is
    scheduled during the previous kernel's last wave, its address setup and an L2
    prefetch of its rows (``cp.async.bulk.prefetch``) run before ``griddepcontrol.wait``,
    and nothing is read or written before the previous grid has finished.

    The config's cache hints (``RowConfig.hints``) each change the PTX; the defaults are the
    measured best.

    Supported: any ``B >= 1``, ``1 <= N <= 32768`` (persistent: ``N <= 8192``;
    ragged ``N`` uses narrower accesses and a predicated last chunk). Tolerance
    against float64 (same as ``torch.nn.functional.layer_norm`` with ``eps``):
    relative L2 error below 1e-5 for f32, 1e-2 for bf16.
    """
    dt = rw.dtype_of(dtype, "build_layer_norm")
    return _KERNELS[config.plan](B, N, dt, eps, config, arch)


def _check_welford(who, plan, N, welford):
    if welford and plan.tail_threads != plan.threads:
        raise ConfigError(f"{where()}: {who}: welford=True needs every thread to hold the same "
                          f"number of values; N={N} leaves a partial last chunk "
                          f"({plan.describe()})")


def _layer_norm_row(B, N, dt, eps, c, arch):
    """The one-row kernel (``RowConfig`` plan ``"row"``)."""
    who = "build_layer_norm"
    plan = rw.plan_rows(B, N, dt, who=who, chunks=c.chunks, threads=c.threads, rows=c.rows)
    _check_welford(who, plan, N, c.welford)
    hints, pdl, welford, maxnreg = c.hints, c.pdl, c.welford, c.maxnreg
    prefetch = plan.elems <= 16
    if maxnreg is None and plan.threads >= 128 and arch != "sm_80":
        # (sm_80's ptxas spills 16 bytes of bf16 4096-element rows at 64: no cap there.)
        # With .maxnreg 64 ptxas keeps the w/b loads ahead of the second reduction; without
        # it, it settles on 40-48 registers and issues them after: 2483 -> 2829 GB/s (f32
        # 2048x8192, H100). Rows of fewer threads pack many rows per CTA and could spill.
        # The one-pass merge holds a few more values: 32 per thread spill 12-16 bytes at 64.
        maxnreg = 72 if welford and plan.elems > 16 else 64

    @kernel(
        in_specs=(Tile(B, N, dt), Tile(N, dt), Tile(N, dt)),
        out_specs=(Tile(B, N, dt),),
        grid=plan.grid,
        block=plan.block,
        name=f"layer_norm_{dt.name}{'_welford' if welford else ''}",
        arch=arch,
        maxnreg=maxnreg,
        pdl=pdl,
    )
    def layer_norm(X, W, Bias, Y):
        from pyptx import ptx, reg  # the tracing layer: loaded at the first trace
        with rw.entry(pdl):
            px, pw, pb, py = ptx.global_ptrs(X, W, Bias, Y)
            io = rw.Rows(plan, hints)
            if pdl:
                io.prefetch_rows(px)
        row, ok = io.locate(io.first_row())
        off = io.offset(row)
        x = io.load(px + off)
        coff = io.offset()
        pwt, pbt = pw + coff, pb + coff
        if prefetch:
            w = io.load(pwt, cache=rw.KEEP)
            b = io.load(pbt, cache=rw.KEEP)
        d, rstd = _centre(io, x, N, eps, welford)
        y = []
        for j in range(plan.chunks):
            sl = slice(j * plan.vec, (j + 1) * plan.vec)
            wj = w[sl] if prefetch else io.load_chunk(pwt, j)
            bj = b[sl] if prefetch else io.load_chunk(pbt, j)
            for dv, wv, bv in zip(rw.mul_all(d[sl], rstd), wj, bj):
                r = reg.scalar(f32)
                ptx.inst.fma.rn.f32(r, dv, wv, bv)
                y.append(r)
        io.store(py + off, y, ok)
        ptx.ret()

    layer_norm.plan = plan
    return layer_norm


def _centre(io, x, N, eps, welford, lanes=False):
    """``(d, rstd)`` of the row whose f32 registers are ``x``: ``d = x - mean`` (the masked
    tail 0) and ``rsqrt(var + eps)``. ``welford``: each thread's own mean and m2, then one
    all-reduce of the pairs (``Rows.reduce_moments``); otherwise the sum, then the sum of
    squared deviations (two all-reduces; ``lanes``: ``Rows.reduce(lanes=True)``)."""
    from pyptx import ptx, reg  # the tracing layer: loaded at the first trace
    s = rw.tree(x, "add")
    if welford:
        mean = reg.scalar(f32)
        ptx.inst.mul.f32(mean, s, 1.0 / io.p.elems)
        own = [v - mean for v in x]
        m2 = rw.dot(own, own)
        io.reduce_moments(mean, m2, io.p.elems)
        return [v - mean for v in x], rw.rstd(m2, N, eps)
    io.reduce([s], lanes=lanes)
    nmean = reg.scalar(f32)
    ptx.inst.mul.f32(nmean, s, -1.0 / N)
    d = io.tail_mask([v + nmean for v in x])
    v = rw.dot(d, d)
    io.reduce([v], lanes=lanes)
    return d, rw.rstd(v, N, eps)


def _layer_norm_ring(B, N, dt, eps, c, arch):
    """Plan ``"ring"`` (``ctas=P, stages=S``): rows streamed through a TMA ring."""
    who = f"build_layer_norm(ctas={c.ctas!r}, stages={c.stages!r})"
    plan, P, S = rw.ring_plan(B, N, dt, who=who, ctas=c.ctas, stages=c.stages, chunks=c.chunks,
                              threads=c.threads)
    maxnreg = rw.ring_reg_cap(plan) if c.maxnreg is None else c.maxnreg
    hints, pdl = c.hints, c.pdl

    @kernel(
        in_specs=(Tile(B, N, dt), Tile(N, dt), Tile(N, dt)),
        out_specs=(Tile(B, N, dt),),
        grid=(P, 1, 1),
        block=plan.block,
        smem=S * N * dt.bytes,
        name=f"layer_norm_ring_{dt.name}",
        arch=arch,
        maxnreg=maxnreg,
        pdl=pdl,
    )
    def layer_norm_ring(X, W, Bias, Y):
        from pyptx import ptx, reg  # the tracing layer: loaded at the first trace
        with rw.entry(pdl):
            px, pw, pb, py = ptx.global_ptrs(X, W, Bias, Y)
            io = rw.Rows(plan, hints)
            ring = rw.Ring(io, S, bulk_store=c.bulk_store)
            if pdl:
                ring.prefetch(px)
        ring.start(px)
        coff = io.offset()
        w = io.hold(pw + coff)
        b = io.hold(pb + coff)

        def first(raw):
            x = io.unpack(raw)
            s = rw.tree(x, "add")
            io.reduce([s])
            return x, s

        def then(state):
            x, s = state
            nmean = reg.scalar(f32)
            ptx.inst.mul.f32(nmean, s, -1.0 / N)
            d = io.tail_mask([v + nmean for v in x])
            v = rw.dot(d, d)
            io.reduce([v])
            rstd = rw.rstd(v, N, eps)
            y = []
            for dv, wv, bv in zip(rw.mul_all(d, rstd), io.unhold(w), io.unhold(b)):
                r = reg.scalar(f32)
                ptx.inst.fma.rn.f32(r, dv, wv, bv)
                y.append(r)
            return y

        ring.run(px, py, first, then)
        ptx.ret()

    layer_norm_ring.plan = plan
    layer_norm_ring.ctas = P
    return layer_norm_ring


def _layer_norm_persistent(B, N, dt, eps, c, arch):
    """Plan ``"persistent"`` (``ctas=P``): ``P`` CTAs walk the rows (``pyptx.rows.row_loop``),
    the next row's loads in flight while this row reduces and stores; ``w``, ``b`` read once."""
    who = f"build_layer_norm(ctas={c.ctas!r})"
    plan = rw.persistent_plan(B, N, dt, who=who, elems=8, chunks=c.chunks, threads=c.threads,
                              rows=c.rows)
    P = rw.persistent_ctas(plan, c.ctas, who)
    _check_welford(who, plan, N, c.welford)
    hints, welford = c.hints, c.welford

    @kernel(
        in_specs=(Tile(B, N, dt), Tile(N, dt), Tile(N, dt)),
        out_specs=(Tile(B, N, dt),),
        grid=(P, 1, 1),
        block=plan.block,
        name=f"layer_norm_persist_{dt.name}{'_welford' if welford else ''}",
        arch=arch,
        maxnreg=persistent_maxnreg(c, plan, arch),
        pdl=c.pdl,
    )
    def layer_norm_persist(X, W, Bias, Y):
        from pyptx import ptx, reg  # the tracing layer: loaded at the first trace
        px, pw, pb, py = ptx.global_ptrs(X, W, Bias, Y)
        io = rw.Rows(plan, hints)
        coff = io.offset()
        w = io.hold(pw + coff)
        b = io.hold(pb + coff)

        def fetch(off, guard, dst):
            return io.load_raw(px + off, guard=guard, dst=dst, cache=rw.PINNED)

        def body(raw, off, ok):
            d, rstd = _centre(io, io.unpack(raw), N, eps, welford, lanes=True)
            y = []
            for dv, wv, bv in zip(rw.mul_all(d, rstd), io.unhold(w), io.unhold(b)):
                r = reg.scalar(f32)
                ptx.inst.fma.rn.f32(r, dv, wv, bv)
                y.append(r)
            io.store(py + off, y, ok)

        rw.row_loop(io, fetch, body)
        ptx.ret()

    layer_norm_persist.plan = plan
    layer_norm_persist.ctas = P
    return layer_norm_persist


_KERNELS = {"row": _layer_norm_row, "persistent": _layer_norm_persistent,
            "ring": _layer_norm_ring}


def build_layer_norm_bwd(B: int, N: int, dtype=f32, eps: float = 1e-5, *,
                         config: RowConfig | None = None,
                         arch: str = DEFAULT_ARCH):
    """Backward of ``build_layer_norm``: ``(x, w, dy) -> (dx, dw, db)``, two launches.

    With ``xhat = (x - mean) * rstd`` and ``g = w * dy``:
    ``dx = rstd * (g - mean(g) - xhat * mean(g * xhat))``, ``dw = sum_rows dy * xhat``,
    ``db = sum_rows dy``. Stage 1 runs ``P = config.ctas`` persistent CTAs (default
    ``min(ceil(B/R), max(264, ceil(B/R/16)))``; the config's ``chunks``/``threads``/``rows``
    set the row shape); each keeps its running ``dw``/``db``
    slices (and ``w`` for short rows) in registers and walks rows ``cta*R, cta*R +
    P*R, ...``: three all-reduces per row (mean, variance, the pair ``sum g``,
    ``sum g*xhat``), ``dx`` written, then the partials go to an f32 ``(P*R*2, N)``
    buffer (row ``2p`` = dw, ``2p+1`` = db) that stage 2 (``pyptx.rows.build_colsum``)
    sums into ``dw`` and ``db`` in ``dtype``. Deterministic (no atomics).

    Supported: ``B >= 1``, ``1 <= N <= 8192``, f32 or bf16. Tolerance against float64
    autograd: relative L2 error below 1e-5 (f32) / 2e-2 (bf16).
    """
    who = "build_layer_norm_bwd"
    c = DEFAULT if config is None else check(config, who, "backward")
    arch = check_arch(arch, who)
    dt = rw.dtype_of(dtype, who)

    def step(io, x, dy, wv, ok, accs, pdx, off):
        from pyptx import ptx, reg  # the tracing layer: loaded at the first trace
        s = rw.tree(x, "add")
        io.reduce([s])
        nmean = reg.scalar(f32)
        ptx.inst.mul.f32(nmean, s, -1.0 / N)
        d = io.tail_mask([v + nmean for v in x])
        var = rw.dot(d, d)
        io.reduce([var])
        ptx.inst.fma.rn.f32(var, var, 1.0 / N, eps)
        rstd = rw.rsqrt(var)
        xhat = rw.mul_all(d, rstd)
        g = [a * b for a, b in zip(wv, dy)]
        sg = rw.tree(g, "add")
        sgx = rw.dot(g, xhat)
        io.reduce([sg, sgx])
        a = reg.scalar(f32)  # -mean(g)
        ptx.inst.mul.f32(a, sg, -1.0 / N)
        c = reg.scalar(f32)  # -mean(g * xhat)
        ptx.inst.mul.f32(c, sgx, -1.0 / N)
        dx = []
        for gi, xi in zip(g, xhat):
            t = reg.scalar(f32)
            ptx.inst.add.f32(t, gi, a)
            ptx.inst.fma.rn.f32(t, xi, c, t)
            ptx.inst.mul.f32(t, t, rstd)
            dx.append(t)
        io.store(pdx + off, dx, ok)
        for aw, ab, xi, di in zip(*accs, xhat, dy):
            ptx.inst.fma.rn.f32(aw, xi, di, aw, pred=ok)
            ptx.inst.add.f32(ab, ab, di, pred=ok)

    return rw.build_norm_backward(B, N, dt, step, who=who, name=f"layer_norm_bwd_{dt.name}",
                                  sums_name=f"layer_norm_dwdb_{dt.name}", parts=2,
                                  chunks=c.chunks, threads=c.threads, rows=c.rows, ctas=c.ctas,
                                  arch=arch)


def layer_norm_op(B: int, N: int, dtype=f32, eps: float = 1e-5):
    """LayerNorm ``(x, w, b) -> y`` with autograd (torch) through the kernels above."""
    import pyptx

    return pyptx.differentiable_kernel(build_layer_norm(B, N, dtype, eps),
                                       build_layer_norm_bwd(B, N, dtype, eps),
                                       save_for_backward=[0, 1])


def reference(x, w, b, eps=1e-5):
    """LayerNorm of nested lists of floats, in Python (float64) arithmetic."""
    out = []
    for row in x:
        mean = sum(row) / len(row)
        var = sum((v - mean) ** 2 for v in row) / len(row)
        rstd = (var + eps) ** -0.5
        out.append([(v - mean) * rstd * wv + bv for v, wv, bv in zip(row, w, b)])
    return out


def main(argv=None) -> int:
    """Check on a GPU, or print the ptxas report."""
    from pyptx.testing import parse_args, run_example

    a = parse_args(__doc__.splitlines()[0], argv, B=16, N=1000, dtype="f32", eps=1e-5)
    B, N, eps = a["B"], a["N"], a["eps"]
    dt = rw.dtype_of(a["dtype"], "layer_norm.py")
    tol = 1e-4 if dt is f32 else 3e-2

    def make_inputs(torch):
        tdt = torch.float32 if dt is f32 else torch.bfloat16
        x = (torch.randn(B, N, device="cuda") * 2 + 0.5).to(tdt)
        w = (torch.randn(N, device="cuda") * 0.1 + 1.0).to(tdt)
        b = (torch.randn(N, device="cuda") * 0.1).to(tdt)
        return x, w, b

    return run_example(build_layer_norm(B, N, dt, eps), make_inputs,
                       lambda x, w, b: reference(x, w, b, eps), atol=tol, rtol=tol)


if __name__ == "__main__":
    raise SystemExit(main())
