"""RMSNorm at the bandwidth ceiling, forward and backward: ``y = x * rsqrt(mean(x**2) + eps) * w``.

The builders take the row count ``B`` and length ``N``; f32 or bf16 storage, f32 arithmetic.
``build_rms_norm_fast`` is tuned over ``RMS_NORM_CONFIGS`` by ``pyptx.autotune`` unless a
``config=RowConfig(...)`` names the plan; ``build_rms_norm_bwd`` returns the dX kernel and the
dW column sum.
"""

from pyptx import Tile, kernel
from pyptx import rows as rw
from pyptx.types import f32
from pyptx_kernels.rows.config import (
    DEFAULT,
    DEFAULT_ARCH,
    RMS_NORM_CONFIGS,
    RowConfig,
    check,
    check_arch,
    persistent_maxnreg,
    tuned,
)


def reference(x, w, eps=1e-6):
    """RMSNorm of nested lists of floats, in Python (float64) arithmetic."""
    out = []
    for row in x:
        rstd = (sum(v * v for v in row) / len(row) + eps) ** -0.5
        out.append([v * rstd * wv for v, wv in zip(row, w)])
    return out


# ----------------------------------------------------------------------------- fast kernels
@tuned("rms_norm", RMS_NORM_CONFIGS)
def build_rms_norm_fast(B: int, N: int, dtype=f32, eps: float = 1e-6, *,
                        config: RowConfig | None = None,
                        arch: str = DEFAULT_ARCH):
    """RMSNorm at the bandwidth ceiling: ``y = x * rsqrt(mean(x**2) + eps) * w``.

    ``X (B, N)`` and ``W (N,)`` in ``dtype`` (f32 or bf16), ``Y (B, N)`` in ``dtype``;
    arithmetic in f32. One pass: each thread loads its ``K`` 16-byte chunks of
    the row (plain ``ld.global``, all in flight before first use)
    and of ``W`` (``ld.global.nc``, kept in L1 for the other rows of the SM),
    sums squares with four fma chains and forms ``x * w`` while the sums travel, all-reduces over the row's threads
    (shuffles, then shared memory and one ``bar.sync`` when a row has several
    warps), scales by ``rsqrt.approx`` and writes the row with 16-byte stores.
    Short rows share a CTA. Launch shape from ``pyptx.rows.plan_rows`` (the config's
    ``chunks``/``threads``/``rows`` override it).

    Called without ``config``, it returns a ``pyptx.autotune.TunedKernel``: at its first
    launch on a device it times the ``RMS_NORM_CONFIGS`` that build, assemble and do not
    spill, on the call's arguments, and keeps the fastest (on disk too). With a
    ``RowConfig`` it builds exactly that plan.

    ``ctas=P`` builds the persistent variant instead: ``min(P, ceil(B/R))`` CTAs,
    each walking rows ``cta*R, cta*R + P*R, ...`` in a device loop with the next
    row's loads issued before this row's reduction, barrier and stores (two
    register sets, ``pyptx.rows.row_loop``); ``w`` is loaded once per CTA and kept
    in registers. Its launch shape aims at 16 values per thread (f32 2048x8192:
    512 threads x 4 chunks, bf16: 512 x 2), 64 registers: two CTAs per SM, so
    ``P`` = 2 x the SM count (264 on an H100) fills the GPU once. ``maxnreg``
    adds ``.maxnreg`` (either variant).

    ``ctas=P, stages=S`` builds the TMA-ring variant (``pyptx.rows.Ring``): ``P`` CTAs of one
    row each step, thread 0 streaming whole rows into ``S`` shared-memory slots with
    ``cp.async.bulk`` so ``S`` rows per CTA are in flight without registers to hold them;
    ``w`` is read once per CTA; ``bulk_store=True`` writes ``y`` back through the slots with
    ``cp.async.bulk`` too. Needs ``N * bytes`` a multiple of 16 and ``S >= 2``.

    ``pdl`` (default True) launches with programmatic dependent launch: the kernel is
    scheduled during the previous kernel's last wave, its address setup and an L2
    prefetch of its rows (``cp.async.bulk.prefetch``) run before ``griddepcontrol.wait``,
    and nothing is read or written before the previous grid has finished.

    The config's cache hints (``RowConfig.hints``) each change the PTX; the defaults are the
    measured best.

    Supported: any ``B >= 1``, ``1 <= N <= 32768`` (persistent: ``N <= 16384``);
    ``N`` not a multiple of the vector width (4 f32 / 8 bf16) uses narrower
    accesses, and a last partial chunk is predicated. Tolerance against
    float64: relative L2 error below 1e-5 for f32, 1e-2 for bf16 (output
    rounding).
    """
    dt = rw.dtype_of(dtype, "build_rms_norm_fast")
    return _KERNELS[config.plan](B, N, dt, eps, config, arch)


def _rms_norm_row(B, N, dt, eps, c, arch):
    """The one-row kernel (``RowConfig`` plan ``"row"``)."""
    plan = rw.plan_rows(B, N, dt, who="build_rms_norm_fast", chunks=c.chunks, threads=c.threads,
                        rows=c.rows)
    hints, pdl = c.hints, c.pdl
    prefetch_w = plan.elems <= 16

    @kernel(
        in_specs=(Tile(B, N, dt), Tile(N, dt)),
        out_specs=(Tile(B, N, dt),),
        grid=plan.grid,
        block=plan.block,
        name=f"rms_norm_{dt.name}",
        arch=arch,
        maxnreg=c.maxnreg,
        pdl=pdl,
    )
    def rms_norm_fast(X, W, Y):
        from pyptx import ptx  # the tracing layer: loaded at the first trace
        with rw.entry(pdl):
            px, pw, py = ptx.global_ptrs(X, W, Y)
            io = rw.Rows(plan, hints)
            if pdl:
                io.prefetch_rows(px)
        row, ok = io.locate(io.first_row())
        off = io.offset(row)
        x = io.load(px + off)
        pwt = pw + io.offset()
        ss = rw.dot(x, x)
        if prefetch_w:  # x * w before the reduction: the w loads overlap it, x dies early
            xw = [r * wv for r, wv in zip(x, io.load(pwt, cache=rw.KEEP))]
        io.reduce([ss])
        rstd = rw.rstd(ss, N, eps)
        y = []
        for j in range(plan.chunks):
            sl = slice(j * plan.vec, (j + 1) * plan.vec)
            if prefetch_w:
                y += rw.mul_all(xw[sl], rstd)
            else:
                y += [r * wv for r, wv in zip(rw.mul_all(x[sl], rstd), io.load_chunk(pwt, j))]
        io.store(py + off, y, ok)
        ptx.ret()

    rms_norm_fast.plan = plan
    return rms_norm_fast


def _rms_norm_persistent(B, N, dt, eps, c, arch):
    """Plan ``"persistent"`` (``ctas=P``): ``P`` CTAs walk the rows (``pyptx.rows.row_loop``),
    the next row's loads in flight while this row reduces and stores; ``w`` read once."""
    who = f"build_rms_norm_fast(ctas={c.ctas!r})"
    plan = rw.persistent_plan(B, N, dt, who=who, elems=16, chunks=c.chunks, threads=c.threads,
                              rows=c.rows)
    P = rw.persistent_ctas(plan, c.ctas, who)
    hints = c.hints

    @kernel(
        in_specs=(Tile(B, N, dt), Tile(N, dt)),
        out_specs=(Tile(B, N, dt),),
        grid=(P, 1, 1),
        block=plan.block,
        name=f"rms_norm_persist_{dt.name}",
        arch=arch,
        maxnreg=persistent_maxnreg(c, plan, arch),
        pdl=c.pdl,
    )
    def rms_norm_persist(X, W, Y):
        from pyptx import ptx, reg  # the tracing layer: loaded at the first trace
        px, pw, py = ptx.global_ptrs(X, W, Y)
        io = rw.Rows(plan, hints)
        w = io.hold(pw + io.offset())

        def fetch(off, guard, dst):
            return io.load_raw(px + off, guard=guard, dst=dst, cache=rw.PINNED)

        def body(raw, off, ok):
            x = io.unpack(raw)
            ss = rw.dot(x, x)
            xw = [r * wv for r, wv in zip(x, io.unhold(w))]
            io.reduce([ss], lanes=True)
            ms = reg.scalar(f32)  # not rw.rstd: keeps the measured PTX (rsqrt after the address)
            ptx.inst.fma.rn.f32(ms, ss, 1.0 / N, eps)
            io.store(py + off, rw.mul_all(xw, rw.rsqrt(ms)), ok)

        rw.row_loop(io, fetch, body)
        ptx.ret()

    rms_norm_persist.plan = plan
    rms_norm_persist.ctas = P
    return rms_norm_persist


def _rms_norm_ring(B, N, dt, eps, c, arch):
    """Plan ``"ring"`` (``ctas=P, stages=S``): rows streamed through a TMA ring."""
    who = f"build_rms_norm_fast(ctas={c.ctas!r}, stages={c.stages!r})"
    plan, P, S = rw.ring_plan(B, N, dt, who=who, ctas=c.ctas, stages=c.stages, chunks=c.chunks,
                              threads=c.threads)
    maxnreg = rw.ring_reg_cap(plan) if c.maxnreg is None else c.maxnreg
    hints, pdl = c.hints, c.pdl

    @kernel(
        in_specs=(Tile(B, N, dt), Tile(N, dt)),
        out_specs=(Tile(B, N, dt),),
        grid=(P, 1, 1),
        block=plan.block,
        smem=S * N * dt.bytes,
        name=f"rms_norm_ring_{dt.name}",
        arch=arch,
        maxnreg=maxnreg,
        pdl=pdl,
    )
    def rms_norm_ring(X, W, Y):
        from pyptx import ptx  # the tracing layer: loaded at the first trace
        with rw.entry(pdl):
            px, pw, py = ptx.global_ptrs(X, W, Y)
            io = rw.Rows(plan, hints)
            ring = rw.Ring(io, S, bulk_store=c.bulk_store)
            if pdl:
                ring.prefetch(px)
        ring.start(px)
        w = io.hold(pw + io.offset())

        def first(raw):
            x = io.unpack(raw)
            ss = rw.dot(x, x)
            xw = [r * wv for r, wv in zip(x, io.unhold(w))]
            io.reduce([ss])
            return ss, xw

        def then(state):
            ss, xw = state
            return rw.mul_all(xw, rw.rstd(ss, N, eps))

        ring.run(px, py, first, then)
        ptx.ret()

    rms_norm_ring.plan = plan
    rms_norm_ring.ctas = P
    return rms_norm_ring


_KERNELS = {"row": _rms_norm_row, "persistent": _rms_norm_persistent, "ring": _rms_norm_ring}


def build_rms_norm_bwd(B: int, N: int, dtype=f32, eps: float = 1e-6, *,
                       config: RowConfig | None = None,
                       arch: str = DEFAULT_ARCH):
    """Backward of ``build_rms_norm_fast``: ``(x, w, dy) -> (dx, dw)``, two launches.

    With ``r = rsqrt(mean(x**2) + eps)`` and ``g = w * dy``:
    ``dx = r * g - x * r**3 * mean(g * x)`` and ``dw = sum over rows of dy * x * r``.
    Stage 1 runs ``P = config.ctas`` persistent CTAs (default ``min(ceil(B/R), max(264,
    ceil(B/R/16)))``; the config's ``chunks``/``threads``/``rows`` set the row shape); each keeps ``w`` and its running ``dw`` slice in registers,
    walks rows ``cta*R, cta*R + P*R, ...`` (one paired all-reduce of ``sum x**2`` and
    ``sum g*x`` per row), writes ``dx`` and finally its partial ``dw`` row to an f32
    ``(P*R, N)`` buffer; stage 2 (``pyptx.rows.build_colsum``) sums the partials into
    ``dw`` in ``dtype``. Deterministic (no atomics).

    Supported: ``B >= 1``, ``1 <= N <= 8192``, f32 or bf16. Tolerance against float64
    autograd: relative L2 error below 1e-5 (f32) / 2e-2 (bf16) for dx and dw.
    Returns a ``pyptx.rows.TwoStage`` (callable like a kernel, ``.kernels`` has both).
    """
    who = "build_rms_norm_bwd"
    c = DEFAULT if config is None else check(config, who, "backward")
    arch = check_arch(arch, who)
    dt = rw.dtype_of(dtype, who)

    def step(io, x, dy, wv, ok, accs, pdx, off):
        from pyptx import ptx, reg  # the tracing layer: loaded at the first trace
        g = [reg.scalar(f32) for _ in x]
        for gi, a, b in zip(g, wv, dy):
            ptx.inst.mul.f32(gi, a, b)
        ss = rw.dot(x, x)
        sg = rw.dot(g, x)
        io.reduce([ss, sg])
        r = rw.rstd(ss, N, eps)
        k = reg.scalar(f32)  # r**3 * mean(g*x)
        ptx.inst.mul.f32(k, r, r)
        ptx.inst.mul.f32(k, k, r)
        ptx.inst.mul.f32(k, k, sg)
        ptx.inst.mul.f32(k, k, 1.0 / N)
        nk = -k
        dx = []
        for gi, xi in zip(g, x):
            t = reg.scalar(f32)
            ptx.inst.mul.f32(t, gi, r)
            ptx.inst.fma.rn.f32(t, xi, nk, t)
            dx.append(t)
        io.store(pdx + off, dx, ok)
        xr = rw.mul_all(x, r)
        for a, xi, di in zip(accs[0], xr, dy):
            ptx.inst.fma.rn.f32(a, xi, di, a, pred=ok)
        if io.p.threads > 32:
            ptx.bar_sync(0)  # next row's reduction reuses the shared slots

    return rw.build_norm_backward(B, N, dt, step, who=who, name=f"rms_norm_bwd_{dt.name}",
                                  sums_name=f"rms_norm_dw_{dt.name}", chunks=c.chunks,
                                  threads=c.threads, rows=c.rows, ctas=c.ctas, arch=arch)


def rms_norm_op(B: int, N: int, dtype=f32, eps: float = 1e-6):
    """RMSNorm ``(x, w) -> y`` with autograd (torch): forward and backward kernels above."""
    import pyptx

    return pyptx.differentiable_kernel(build_rms_norm_fast(B, N, dtype, eps),
                                       build_rms_norm_bwd(B, N, dtype, eps),
                                       save_for_backward=[0, 1])
