"""RMSNorm with a fused residual add, forward and backward: ``h = x + residual``,
``y = h * rsqrt(mean(h**2) + eps) * w``, as a pre-norm transformer block runs it.

``build_add_rms_norm`` writes ``(y, h)`` in one pass (``h`` is the block's new residual);
``build_add_rms_norm_bwd`` takes the gradients of both outputs, ``(h, w, dy, dh)``, and writes
``dx`` (the gradient of ``x`` and of ``residual``: the same tensor) and the ``dw`` partials in
one pass, then sums them (``pyptx.rows.build_colsum``). f32 or bf16 storage, f32 arithmetic;
for bf16, ``h`` is rounded to bf16 before it is normalised, so forward, stored residual and
backward all see the same ``h`` (what torch computes for ``x + residual`` in bf16).
"""

from pyptx import Tile, kernel
from pyptx import rows as rw
from pyptx.errors import ConfigError
from pyptx.types import b16, f32, u32
from pyptx_kernels._common import where
from pyptx_kernels.rows.config import DEFAULT, RowConfig

#: The RowConfig fields each builder takes.
FORWARD_FIELDS = ("chunks", "threads", "rows", "pdl", "maxnreg")
BACKWARD_FIELDS = ("chunks", "threads", "rows", "ctas")


def _config(config, who: str, fields) -> RowConfig:
    if config is None:
        return DEFAULT
    if not isinstance(config, RowConfig):
        raise ConfigError(f"{where()}: {who}: config must be a RowConfig, got {config!r}")
    extra = [k for k in config.kwargs if k not in fields]
    if extra:
        raise ConfigError(f"{where()}: {who}: {config!r} sets {', '.join(extra)}, which this "
                          f"kernel does not take (it takes {', '.join(fields)})")
    return config


def _round(vals: list, dt) -> list:
    """``vals`` rounded to ``dt`` and back to f32 (no instruction for f32)."""
    from pyptx import ptx, reg  # the tracing layer: loaded at the first trace
    if dt is f32:
        return vals
    out = []
    for v in vals:
        h, r = reg.scalar(b16), reg.scalar(f32)
        ptx.inst.cvt.rn.bf16.f32(h, v)
        ptx.inst.cvt.f32.bf16(r, h)
        out.append(r)
    return out


def build_add_rms_norm(B: int, N: int, dtype=f32, eps: float = 1e-6, *,
                       config: RowConfig | None = None):
    """``(X, R, W) -> (Y, H)``: ``H = X + R`` and ``Y = rms_norm(H) * W`` for ``X, R, Y, H
    (B, N)`` and ``W (N,)`` in ``dtype`` (f32 or bf16), f32 arithmetic.

    The one-row kernel of ``build_rms_norm_fast`` (``pyptx.rows.plan_rows``; the config's
    ``chunks``/``threads``/``rows``/``pdl``/``maxnreg`` override it): each thread loads its
    16-byte chunks of ``x`` and ``r`` (all in flight), stores ``h`` while the sum of squares
    all-reduces over the row's threads, then writes ``y``. Reads ``2BN + N``, writes ``2BN``
    elements. Supported: ``B >= 1``, ``1 <= N <= 32768``. Tolerance against float64: relative
    L2 error below 1e-5 (f32) / 1e-2 (bf16)."""
    who = "build_add_rms_norm"
    c = _config(config, who, FORWARD_FIELDS)
    dt = rw.dtype_of(dtype, who)
    plan = rw.plan_rows(B, N, dt, who=who, chunks=c.chunks, threads=c.threads, rows=c.rows)
    pdl = c.pdl

    @kernel(
        in_specs=(Tile(B, N, dt), Tile(B, N, dt), Tile(N, dt)),
        out_specs=(Tile(B, N, dt), Tile(B, N, dt)),
        grid=plan.grid,
        block=plan.block,
        name=f"add_rms_norm_{dt.name}",
        maxnreg=c.maxnreg,
        pdl=pdl,
    )
    def add_rms_norm(X, R, W, Y, H):
        from pyptx import ptx, reg  # the tracing layer: loaded at the first trace
        with rw.entry(pdl):
            px, pr, pw, py, ph = ptx.global_ptrs(X, R, W, Y, H)
            io = rw.Rows(plan)
            if pdl:
                io.prefetch_rows(px, pr)
        row, ok = io.locate(io.first_row())
        off = io.offset(row)
        x = io.load(px + off)
        r = io.load(pr + off)
        h = [reg.scalar(f32) for _ in x]
        for hi, a, b in zip(h, x, r):
            ptx.inst.add.f32(hi, a, b)
        h = _round(h, dt)
        io.store(ph + off, h, ok)
        ss = rw.dot(h, h)
        hw = [a * wv for a, wv in zip(h, io.load(pw + io.offset(), cache=rw.KEEP))]
        io.reduce([ss])
        io.store(py + off, rw.mul_all(hw, rw.rstd(ss, N, eps)), ok)
        ptx.ret()

    add_rms_norm.plan = plan
    return add_rms_norm


def build_add_rms_norm_bwd(B: int, N: int, dtype=f32, eps: float = 1e-6, *,
                           config: RowConfig | None = None):
    """Backward of ``build_add_rms_norm``: ``(H, W, DY, DH) -> (DX, DW)``, two launches.

    With ``r = rsqrt(mean(h**2) + eps)`` and ``g = w * dy``:
    ``dx = r * g - h * r**3 * mean(g * h) + dh`` (the gradient of ``x`` and of the residual)
    and ``dw = sum over rows of dy * h * r``. Stage 1 is ``build_rms_norm_bwd``'s persistent
    walk (``P`` CTAs, ``config.ctas``, default ``pyptx.rows.bwd_ctas``) with ``dh`` read next
    to ``dy`` and added before the store; stage 2 sums the f32 ``dw`` partials. Deterministic.
    Supported: ``B >= 1``, ``1 <= N <= 8192``. Tolerance against float64: relative L2 error
    below 1e-5 (f32) / 2e-2 (bf16). Returns a ``pyptx.rows.TwoStage``."""
    who = "build_add_rms_norm_bwd"
    c = _config(config, who, BACKWARD_FIELDS)
    dt = rw.dtype_of(dtype, who)
    plan = rw.plan_rows(B, N, dt, who=who, chunks=c.chunks, threads=c.threads, rows=c.rows,
                        max_n=rw.MAX_N_BWD, max_elems=16, target_bytes=32)
    P = rw.bwd_ctas(plan, c.ctas)
    R = plan.rows
    hold_w = plan.elems <= 8

    @kernel(
        in_specs=(Tile(B, N, dt), Tile(N, dt), Tile(B, N, dt), Tile(B, N, dt)),
        out_specs=(Tile(B, N, dt), Tile(P * R, N, f32)),
        grid=(P, 1, 1),
        block=plan.block,
        name=f"add_rms_norm_bwd_{dt.name}",
        maxnreg=rw.reg_cap(plan),
    )
    def add_rms_norm_bwd(H, W, DY, DH, DX, PART):
        from pyptx import ptx, reg  # the tracing layer: loaded at the first trace
        ph, pw, pdy, pdh, pdx, ppart = ptx.global_ptrs(H, W, DY, DH, DX, PART)
        io = rw.Rows(plan)
        pwt = pw + io.offset()
        w = io.load(pwt, cache=rw.KEEP) if hold_w else None
        acc = [reg.scalar(f32, init=0.0) for _ in range(plan.elems)]
        start = reg.scalar(u32)
        ptx.inst.mul.lo.u32(start, ptx.special.ctaid.x(), R)
        for it in ptx.loop(start, B, P * R, unroll=False):
            row, ok = io.locate(it if R == 1 else it + io.g)
            off = io.offset(row)
            h = io.load(ph + off)
            dy = io.load(pdy + off)
            dh = io.load(pdh + off)
            wv = w if w is not None else io.load(pwt, cache=rw.KEEP)
            g = [reg.scalar(f32) for _ in h]
            for gi, a, b in zip(g, wv, dy):
                ptx.inst.mul.f32(gi, a, b)
            ss = rw.dot(h, h)
            sg = rw.dot(g, h)
            io.reduce([ss, sg])
            r = rw.rstd(ss, N, eps)
            k = reg.scalar(f32)  # -r**3 * mean(g*h)
            ptx.inst.mul.f32(k, r, r)
            ptx.inst.mul.f32(k, k, r)
            ptx.inst.mul.f32(k, k, sg)
            ptx.inst.mul.f32(k, k, -1.0 / N)
            dx = []
            for gi, hi, di in zip(g, h, dh):
                t = reg.scalar(f32)
                ptx.inst.fma.rn.f32(t, gi, r, di)
                ptx.inst.fma.rn.f32(t, hi, k, t)
                dx.append(t)
            io.store(pdx + off, dx, ok)
            for a, hr, d in zip(acc, rw.mul_all(h, r), dy):
                ptx.inst.fma.rn.f32(a, hr, d, a, pred=ok)
            if plan.threads > 32:
                ptx.bar_sync(0)  # the next row's reduction reuses the shared slots
        prow = reg.scalar(u32)
        ptx.inst.mul.lo.u32(prow, ptx.special.ctaid.x(), R)
        if R > 1:
            prow = prow + io.g
        io.store(ppart + io.offset(prow, es=4), acc, dtype=f32)
        ptx.ret()

    colsum = rw.build_colsum(P * R, 1, N, dt, name=f"add_rms_norm_dw_{dt.name}")
    out = rw.TwoStage(add_rms_norm_bwd, colsum)
    out.plan = plan
    return out


def reference(x, residual, w, eps=1e-6):
    """``(y, h)`` of nested lists of floats in Python (float64) arithmetic."""
    h = [[a + b for a, b in zip(rx, rr)] for rx, rr in zip(x, residual)]
    y = []
    for row in h:
        rstd = (sum(v * v for v in row) / len(row) + eps) ** -0.5
        y.append([v * rstd * wv for v, wv in zip(row, w)])
    return y, h


__all__ = ["build_add_rms_norm", "build_add_rms_norm_bwd", "reference"]
