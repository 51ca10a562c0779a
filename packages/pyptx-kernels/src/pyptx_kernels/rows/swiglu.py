"""SwiGLU at the bandwidth ceiling: ``y = silu(g) * u = g * u / (1 + exp(-g))``, elementwise.

The ``(B, N)`` inputs are walked as one flat array of ``B * N`` elements in
16-byte vectors (4 f32 / 8 bf16 per access; narrower when ``N`` is not a
multiple); ``B`` is a kernel parameter. Each thread of a 256-thread CTA loads ``K`` vectors of ``g`` and of
``u`` (all in flight at once, plain ``ld.global``) at a stride of
one CTA width, so every warp access is contiguous, computes in f32 with
``ex2.approx`` and ``rcp.approx``, and writes with 16-byte stores. Only the
last CTA can be partial: it takes a predicated copy of the body; the others
run unpredicated. ``bulk=True`` instead brings each CTA's slices of ``g`` and ``u``
into shared memory with two ``cp.async.bulk`` copies (one mbarrier): at 1024
threads it is the fastest shape measured for f32 8192x8192 on the H100.

``build_swiglu_backward`` walks ``dY``, ``G`` and ``U`` the same way and writes ``dG`` and
``dU`` in one pass.

    python -m pyptx_kernels.rows.swiglu [B] [N] [--dtype f32|bf16]
"""

from pyptx import SpecError, Tile, kernel
from pyptx import rows as rw
from pyptx.types import b64, f32, u32, u64
from pyptx_kernels._common import where
from pyptx_kernels.rows.config import (
    DEFAULT_ARCH,
    SWIGLU_BACKWARD_CONFIGS,
    SWIGLU_CONFIGS,
    RowConfig,
    tuned,
)

#: threads per CTA when the config leaves ``threads`` to the builder
THREADS = 256


@tuned("swiglu", SWIGLU_CONFIGS)
def build_swiglu(B: int, N: int, dtype=f32, *, config: RowConfig | None = None,
                 arch: str = DEFAULT_ARCH):
    """``Y = silu(G) * U`` for ``G, U, Y`` of shape ``(B, N)`` in ``dtype`` (f32 or bf16).

    The config's ``threads`` per CTA (default 256) and ``chunks`` (16-byte vectors per thread
    and input;
    default 1: with the L2 prefetch of PDL launches, many small CTAs beat fewer large
    ones on the H100 at every benchmark size) set the launch shape; grid = ceil(vectors /
    (threads * chunks)); the vector width comes from ``N`` and ``B`` is a kernel parameter, so
    one PTX serves every ``B``. Supported: any ``B, N >= 1`` with ``B * N < 2**32``.
    Tolerance against float64: relative L2 error below 1e-5 for f32, 1e-2 for
    bf16.

    ``pdl`` (default True) launches with programmatic dependent launch: the kernel is
    scheduled during the previous kernel's last wave, thread 0 of each CTA asks for the
    CTA's slices of ``G`` and ``U`` in L2 (``cp.async.bulk.prefetch``) before
    ``griddepcontrol.wait``, and nothing is read or written before the previous grid
    has finished.

    Plan ``"bulk"`` (``bulk=True``) moves each CTA's slices of ``G`` and ``U`` into shared memory with two
    ``cp.async.bulk`` copies issued by thread 0 (one mbarrier); threads read their vectors
    with ``ld.shared``. ``bulk_store=True`` (with ``bulk``) also writes the CTA's slice of
    ``Y`` back through shared memory with one bulk store. Both need ``N * bytes`` to be
    a multiple of 16.

    The config's cache hints (``RowConfig.hints``) each change the PTX; the defaults are the
    measured best.

    Called without ``config``, it returns a ``pyptx.autotune.TunedKernel``: at its first
    launch on a device it times the ``SWIGLU_CONFIGS`` that build, assemble and do not spill,
    on the call's arguments, and keeps the fastest (on disk too). With a ``RowConfig`` (plan
    ``"row"`` or ``"bulk"``) it builds exactly that plan.
    """
    who = "build_swiglu"
    dt = rw.dtype_of(dtype, who)
    c = config
    hints, pdl, bulk, bulk_store = c.hints, c.pdl, c.bulk, c.bulk_store
    threads, vec, k, grid = _flat_shape(who, B, N, dt, c)
    es = dt.bytes
    per_cta = threads * k
    stride = threads * vec * es
    span = per_cta * vec * es  # bytes of one input per CTA
    if bulk and (N * es) % 16:
        raise SpecError(f"{where()}: {who}: bulk=True needs N * {es} bytes to be a multiple of 16, "
                        f"got N={N}")
    if bulk:
        return _swiglu_bulk(B, N, dt, threads, k, vec, grid, span, pdl, bulk_store, hints,
                            arch)

    @kernel(
        in_specs=(Tile(B, N, dt), Tile(B, N, dt)),
        out_specs=(Tile(B, N, dt),),
        grid=(grid, 1, 1),
        block=(threads, 1, 1),
        pdl=pdl,
        name=f"swiglu_{dt.name}",
        arch=arch,
    )
    def swiglu(G, U, Y):
        from pyptx import ptx, reg  # the tracing layer: loaded at the first trace
        with rw.entry(pdl):
            pg, pu, py = ptx.global_ptrs(G, U, Y)
            mv = _vectors(B, N // vec)
            cta = ptx.special.ctaid.x()
            tid = ptx.special.tid.x()
            if pdl and hints.pdl_prefetch:
                rw.prefetch_cta_slice((pg, pu), span, mv, tid, unit=vec * es)
            idx = reg.scalar(u32)
            ptx.inst.mad.lo.u32(idx, cta, per_cta, tid)
            off = reg.scalar(u64)
            ptx.inst.mul.wide.u32(off, idx, vec * es)
            ag, au, ay = pg + off, pu + off, py + off

        def body(masked: bool) -> None:
            preds = _inside(idx, mv, threads, k) if masked else [None] * k
            gs, us = [], []
            for j in range(k):
                gs.append(rw.load_vec(ag, j * stride, dt, vec, pred=preds[j], cache=hints.load,
                                      policy=hints.l2_load))
                us.append(rw.load_vec(au, j * stride, dt, vec, pred=preds[j], cache=hints.load,
                                      policy=hints.l2_load))
            for j in range(k):
                ys = [_silu_mul(gv, uv) for gv, uv in zip(gs[j], us[j])]
                rw.store_vec(ay, j * stride, dt, ys, pred=preds[j], cache=hints.store,
                             policy=hints.l2_store)

        _last_cta_masked(cta, body)

    swiglu.geometry = dict(vec=vec, chunks=k, threads=threads, grid=grid)
    return swiglu


@tuned("swiglu_backward", SWIGLU_BACKWARD_CONFIGS)
def build_swiglu_backward(B: int, N: int, dtype=f32, *, config: RowConfig | None = None,
                          arch: str = DEFAULT_ARCH):
    """SwiGLU's gradients: ``dG = dY * U * s * (1 + G * (1 - s))`` and ``dU = dY * G * s``
    with ``s = sigmoid(G)``, for ``dY, G, U`` (inputs) and ``dG, dU`` (outputs) of shape
    ``(B, N)`` in ``dtype`` (f32 or bf16).

    The launch shape, the flat walk, the predicated last CTA, PDL (with the L2 prefetch of
    the CTA's slices of the three inputs) and the cache hints are ``build_swiglu``'s plan
    ``"row"``; ``B`` is a kernel parameter, so one PTX serves every ``B``. Supported: any
    ``B, N >= 1`` with ``B * N < 2**32``. Tolerance against float64: relative L2 error below
    1e-5 for f32, 1e-2 for bf16.

    Called without ``config``, a ``pyptx.autotune.TunedKernel`` over
    ``SWIGLU_BACKWARD_CONFIGS`` (the plan settled as ``build_swiglu``'s is); with a
    ``RowConfig``, exactly that plan.
    """
    who = "build_swiglu_backward"
    dt = rw.dtype_of(dtype, who)
    hints, pdl = config.hints, config.pdl
    threads, vec, k, grid = _flat_shape(who, B, N, dt, config)
    es = dt.bytes
    per_cta = threads * k
    stride = threads * vec * es
    span = per_cta * vec * es

    @kernel(
        in_specs=(Tile(B, N, dt), Tile(B, N, dt), Tile(B, N, dt)),
        out_specs=(Tile(B, N, dt), Tile(B, N, dt)),
        grid=(grid, 1, 1),
        block=(threads, 1, 1),
        pdl=pdl,
        name=f"swiglu_bwd_{dt.name}",
        arch=arch,
    )
    def swiglu_bwd(DY, G, U, DG, DU):
        from pyptx import ptx, reg  # the tracing layer: loaded at the first trace
        with rw.entry(pdl):
            ptrs = ptx.global_ptrs(DY, G, U, DG, DU)
            mv = _vectors(B, N // vec)
            cta = ptx.special.ctaid.x()
            tid = ptx.special.tid.x()
            if pdl and hints.pdl_prefetch:
                rw.prefetch_cta_slice(ptrs[:3], span, mv, tid, unit=vec * es)
            idx = reg.scalar(u32)
            ptx.inst.mad.lo.u32(idx, cta, per_cta, tid)
            off = reg.scalar(u64)
            ptx.inst.mul.wide.u32(off, idx, vec * es)
            ady, ag, au, adg, adu = (p + off for p in ptrs)

        def body(masked: bool) -> None:
            preds = _inside(idx, mv, threads, k) if masked else [None] * k
            loaded = []
            for j in range(k):
                loaded.append([rw.load_vec(a, j * stride, dt, vec, pred=preds[j],
                                           cache=hints.load, policy=hints.l2_load)
                               for a in (ady, ag, au)])
            for j, (dys, gs, us) in enumerate(loaded):
                grads = [_silu_mul_grad(dy, g, u) for dy, g, u in zip(dys, gs, us)]
                for a, vals in ((adg, [d[0] for d in grads]), (adu, [d[1] for d in grads])):
                    rw.store_vec(a, j * stride, dt, vals, pred=preds[j], cache=hints.store,
                                 policy=hints.l2_store)

        _last_cta_masked(cta, body)

    swiglu_bwd.geometry = dict(vec=vec, chunks=k, threads=threads, grid=grid)
    return swiglu_bwd


def _last_cta_masked(cta, body):
    """Emit ``body(False)`` for every CTA but the last and ``body(True)`` (predicated) for the
    last: only it can be partial, since ``B`` is known at launch only."""
    from pyptx import ptx, reg  # the tracing layer: loaded at the first trace
    last = reg.scalar(u32)
    ptx.inst.sub.u32(last, ptx.special.nctaid.x(), 1)
    tail = ptx.label("tail")
    ptx.bra(tail, pred=cta == last)
    body(False)
    ptx.ret()
    ptx.place(tail)
    body(True)
    ptx.ret()


def _flat_shape(who, B, N, dt, config):
    """``(threads, vec, chunks, grid)`` of a flat walk of ``B * N`` elements under ``config``
    (the vector width from ``N`` alone, so the PTX serves every ``B``)."""
    threads = THREADS if config.threads is None else config.threads
    for name, v in (("B", B), ("N", N), ("threads", threads)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise SpecError(f"{where()}: {who}: {name} must be a positive int, got {v!r}")
    if threads % 32 or threads > 1024:
        raise SpecError(f"{where()}: {who}: threads must be a multiple of 32 up to 1024, got {threads}")
    M = B * N
    if M >= 2**32:
        raise SpecError(f"{where()}: {who}: B * N must be below 2**32, got {M}")
    vec = 16 // dt.bytes
    while N % vec:
        vec //= 2
    k = config.chunks if config.chunks is not None else 1  # one 16-byte vector: fastest measured
    k = min(k, max(1, 32 // vec))
    return threads, vec, k, -(-(M // vec) // (threads * k))


def _vectors(B, per_row):
    """The arrays' ``vec``-wide vectors, ``B * per_row`` (u32; ``B`` the ``nrows`` parameter)."""
    from pyptx import ptx, reg  # the tracing layer: loaded at the first trace
    mv = reg.scalar(u32)
    ptx.inst.mul.lo.u32(mv, ptx.scalar_param(u32, B, name="nrows"), per_row)
    return mv


def _inside(idx, mv, threads, k):
    """Per chunk ``j``: is vector ``idx + j * threads`` inside the ``mv`` vectors."""
    from pyptx import ptx, reg  # the tracing layer: loaded at the first trace
    preds = [idx < mv]
    for j in range(1, k):
        at = reg.scalar(u32)
        ptx.inst.add.u32(at, idx, j * threads)
        preds.append(at < mv)
    return preds


def _swiglu_bulk(B, N, dt, threads, k, vec, grid, span, pdl, bulk_store, hints, arch):
    """``build_swiglu(..., bulk=True)``: the CTA's slices arrive by bulk copy into shared memory."""
    es = dt.bytes
    stride = threads * vec * es

    @kernel(
        in_specs=(Tile(B, N, dt), Tile(B, N, dt)),
        out_specs=(Tile(B, N, dt),),
        grid=(grid, 1, 1),
        block=(threads, 1, 1),
        smem=2 * span,
        pdl=pdl,
        name=f"swiglu_bulk_{dt.name}",
        arch=arch,
    )
    def swiglu_bulk(G, U, Y):
        from pyptx import ptx, reg, smem  # the tracing layer: loaded at the first trace
        with rw.entry(pdl):
            pg, pu, py = ptx.global_ptrs(G, U, Y)
            cta = ptx.special.ctaid.x()
            tid = ptx.special.tid.x()
            win = smem.dynamic(name="slices")
            bar = smem.alloc(b64, 1, align=8, name="slices_bar").addr()
            base = win.addr()
            lead = tid == 0
            with ptx.if_(lead):
                ptx.mbarrier.init(bar, 1)
                ptx.fence_proxy_async()
            ptx.bar_sync(0)
            mv = _vectors(B, N // vec)
            start, nbytes = rw.cta_slice(span, mv, vec * es)
            if pdl and hints.pdl_prefetch:
                rw.prefetch_cta_slice((pg, pu), span, mv, tid, unit=vec * es,
                                      where=(start, nbytes))
            tx = reg.scalar(u32)
            ptx.inst.add.u32(tx, nbytes, nbytes)
            idx = reg.scalar(u32)
            ptx.inst.mad.lo.u32(idx, cta, threads * k, tid)
            mine = reg.scalar(u32)
            ptx.inst.mad.lo.u32(mine, tid, vec * es, base)
            if not bulk_store:
                off = reg.scalar(u64)
                ptx.inst.mul.wide.u32(off, idx, vec * es)
                ay = py + off
        with ptx.if_(lead):
            ptx.mbarrier.arrive_expect_tx(bar, tx)
            ptx.tma.copy_bulk(base, pg + start, nbytes, bar)
            ptx.tma.copy_bulk(base + span, pu + start, nbytes, bar)
        ptx.mbarrier.wait(bar, 0)
        inside = _inside(idx, mv, threads, k)
        for j in range(k):
            ok = inside[j]
            g = rw.load_vec(mine, j * stride, dt, vec, pred=ok, space="shared")
            u = rw.load_vec(mine, span + j * stride, dt, vec, pred=ok, space="shared")
            ys = [_silu_mul(gv, uv) for gv, uv in zip(g, u)]
            if bulk_store:
                rw.store_vec(mine, j * stride, dt, ys, pred=ok, space="shared")
            else:
                rw.store_vec(ay, j * stride, dt, ys, pred=ok, cache=hints.store,
                             policy=hints.l2_store)
        if bulk_store:
            ptx.fence_proxy_async()
            ptx.bar_sync(0)
            with ptx.if_(lead):
                ptx.tma.store_bulk(py + start, base, nbytes)
                ptx.tma.commit_group()
                ptx.tma.wait_group(0, read=True)
        ptx.ret()

    swiglu_bulk.geometry = dict(vec=vec, chunks=k, threads=threads, grid=grid, bulk=True,
                                bulk_store=bulk_store)
    return swiglu_bulk


def _silu_mul(g, u):
    from pyptx import ptx, reg  # the tracing layer: loaded at the first trace
    e = reg.scalar(f32)
    ptx.inst.mul.f32(e, g, -rw.LOG2E)
    ptx.inst.ex2.approx.ftz.f32(e, e)
    ptx.inst.add.f32(e, e, 1.0)
    ptx.inst.rcp.approx.ftz.f32(e, e)
    y = reg.scalar(f32)
    ptx.inst.mul.f32(y, g, u)
    ptx.inst.mul.f32(y, y, e)
    return y


def _silu_mul_grad(dy, g, u):
    """``(dy * u * s * (1 + g * (1 - s)), dy * g * s)`` with ``s = sigmoid(g)``, f32."""
    from pyptx import ptx, reg  # the tracing layer: loaded at the first trace
    s = reg.scalar(f32)
    ptx.inst.mul.f32(s, g, -rw.LOG2E)
    ptx.inst.ex2.approx.ftz.f32(s, s)
    ptx.inst.add.f32(s, s, 1.0)
    ptx.inst.rcp.approx.ftz.f32(s, s)
    gs = reg.scalar(f32)
    ptx.inst.mul.f32(gs, g, s)
    t = reg.scalar(f32)
    ptx.inst.sub.f32(t, 1.0, s)
    ptx.inst.fma.rn.f32(t, gs, t, s)
    dg = reg.scalar(f32)
    ptx.inst.mul.f32(dg, dy, u)
    ptx.inst.mul.f32(dg, dg, t)
    du = reg.scalar(f32)
    ptx.inst.mul.f32(du, dy, gs)
    return dg, du


def reference(g, u):
    """silu(g) * u of nested lists of floats, in Python (float64) arithmetic."""
    import math

    def silu(v):
        return v / (1.0 + math.exp(-v)) if v > -700 else 0.0

    return [[silu(a) * b for a, b in zip(rg, ru)] for rg, ru in zip(g, u)]


def main(argv=None) -> int:
    """Check on a GPU, or print the ptxas report."""
    from pyptx.testing import parse_args, run_example

    a = parse_args(__doc__.splitlines()[0], argv, B=16, N=1000, dtype="f32")
    B, N = a["B"], a["N"]
    dt = rw.dtype_of(a["dtype"], "swiglu.py")
    tol = 1e-5 if dt is f32 else 1e-2

    def make_inputs(torch):
        tdt = torch.float32 if dt is f32 else torch.bfloat16
        return ((torch.randn(B, N, device="cuda") * 3).to(tdt),
                torch.randn(B, N, device="cuda").to(tdt))

    return run_example(build_swiglu(B, N, dt), make_inputs, reference, atol=tol, rtol=tol)


if __name__ == "__main__":
    raise SystemExit(main())
