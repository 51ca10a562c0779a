"""The norms' backward kernels: the shared two-stage skeleton and its parts.

``build_norm_backward`` makes stage 1 (persistent CTAs walking rows with the weights held and
the weight gradients accumulated in registers, a per-row step given by the caller) and
stage 2; ``build_colsum`` (stage 2) sums the per-CTA partial weight gradients ``(P*C, N)``
f32 over ``P`` into ``C`` vectors of ``N``; ``TwoStage`` chains a backward kernel and its
colsum into one callable with ``in_specs``/``out_specs`` so ``pyptx.differentiable_kernel``
takes it.
"""

from __future__ import annotations

from typing import Any

from .. import ptx, reg, smem
from ..errors import ConfigError
from ..kernel import kernel
from ..source import where
from ..specs import Tile
from ..types import PtxType, f32, u32, u64
from .access import KEEP, STREAM, Hints, load_vec, store_vec
from .loop import row_groups
from .plan import MAX_N_BWD, WARP, bwd_ctas, plan_rows, reg_cap
from .view import Rows

__all__ = ["build_norm_backward", "build_colsum", "TwoStage"]


def build_norm_backward(B: int, N: int, dtype: PtxType, step: Any, *, who: str, name: str,
                        sums_name: str, parts: int = 1, chunks: int | None = None,
                        threads: int | None = None, rows: int | None = None,
                        ctas: int | None = None, arch: str = "sm_90a") -> TwoStage:
    """A norm's backward ``(x, w, dy) -> (dx, *weight gradients)`` as a ``TwoStage``.

    Stage 1 (kernel ``name``): ``P`` persistent CTAs (``bwd_ctas``; ``ctas`` overrides) of
    ``plan_rows`` at ~32 bytes per thread (``chunks``/``threads``/``rows`` override), ``w`` held
    in registers where a thread has at most 8 values; each walks its row groups
    (``row_groups``: the grid and the row count at run time), loads ``x`` and ``dy`` and calls
    ``step(io, x, dy, w, ok, accs, pdx, off)``, which computes and stores ``dx`` (at ``pdx +
    off``) and adds the row
    into ``accs`` (``parts`` lists of f32 registers, zeroed; ``ok`` is the store predicate);
    then writes its ``parts`` partial vectors, row ``(cta*R + g)*parts + c`` of an f32
    ``(P*R*parts, N)`` buffer. Stage 2 (``build_colsum``, kernel ``sums_name``) adds the
    partials into ``parts`` gradients of ``N`` in ``dtype``. ``parts`` is 1 or 2."""
    if parts not in (1, 2):
        raise ConfigError(f"{where()}: build_norm_backward: parts must be 1 or 2, got {parts}")
    plan = plan_rows(B, N, dtype, who=who, chunks=chunks, threads=threads, rows=rows,
                     max_n=MAX_N_BWD, max_elems=16, target_bytes=32)
    P = bwd_ctas(plan, ctas)
    R = plan.rows
    hold_w = plan.elems <= 8

    @kernel(
        in_specs=(Tile(B, N, dtype), Tile(N, dtype), Tile(B, N, dtype)),
        out_specs=(Tile(B, N, dtype), Tile(P * R * parts, N, f32)),
        grid=(P, 1, 1),
        block=plan.block,
        name=name,
        arch=arch,
        maxnreg=reg_cap(plan),
    )
    def norm_bwd(X, W, DY, DX, PART):
        px, pw, pdy, pdx, ppart = ptx.global_ptrs(X, W, DY, DX, PART)
        io = Rows(plan)
        pwt = pw + io.offset()
        w = io.load(pwt, cache=KEEP) if hold_w else None
        accs = [[reg.scalar(f32, init=0.0) for _ in range(plan.elems)] for _ in range(parts)]
        for it in row_groups(io):
            row, ok = io.locate(it if R == 1 else it + io.g)
            off = io.offset(row)
            x = io.load(px + off)
            dy = io.load(pdy + off)
            wv = w if w is not None else io.load(pwt, cache=KEEP)
            step(io, x, dy, wv, ok, accs, pdx, off)
        prow = reg.scalar(u32)
        ptx.inst.mul.lo.u32(prow, ptx.special.ctaid.x(), parts * R)
        if R > 1:
            prow = prow + (io.g if parts == 1 else io.g << 1)
        poff = io.offset(prow, es=4)
        for c, acc in enumerate(accs):
            io.store(ppart + poff + c * N * 4 if c else ppart + poff, acc, dtype=f32)
        ptx.ret()

    out = TwoStage(norm_bwd, build_colsum(P * R, parts, N, dtype, name=sums_name, arch=arch))
    out.plan = plan
    return out


def build_colsum(P: int, C: int, N: int, dtype: PtxType, *, name: str = "colsum",
                 ry: int = 8, unroll: int = 4, hints: Hints | None = None,
                 arch: str = "sm_90a"):
    """Sum partials ``(P*C, N)`` f32 (row ``p*C + c``) over ``p`` into ``C`` outputs ``(N,)``.

    CTA = 32 column vectors x ``ry`` row slices; each thread adds rows
    ``ty, ty+ry, ...`` (``unroll`` loads in flight per step), the slices are
    added through shared memory and the first slice writes the result in
    ``dtype``. Grid ``(ceil(N/vec/32), C)``; ``arch`` the target. ``P`` is a kernel parameter (``nparts``): the
    PTX is the same for every ``P``. ``hints``: the L2 policies and store
    modifier of its partial loads and result stores (default none).
    """
    hints = hints if hints is not None else Hints()
    cvec = 4 if N % 4 == 0 else 2 if N % 2 == 0 else 1
    ncv = N // cvec
    gx = -(-ncv // WARP)
    step = ry * unroll
    row_bytes = N * 4

    if C not in (1, 2):
        raise ConfigError(f"{where()}: build_colsum: C must be 1 or 2, got {C}")

    def body(Part, Outs):
        pp, *pouts = ptx.global_ptrs(Part, *Outs)
        tx = ptx.special.tid.x()
        ty = ptx.special.tid.y()
        c = ptx.special.ctaid.y()
        col = reg.scalar(u32)
        ptx.inst.mad.lo.u32(col, ptx.special.ctaid.x(), WARP, tx)
        ok = None
        if ncv % WARP:
            ok = col < ncv
            colc = reg.scalar(u32)
            ptx.inst.min.u32(colc, col, ncv - 1)
        else:
            colc = col
        # address of partial[ty * C + c, colc * cvec]
        r0 = reg.scalar(u32)
        ptx.inst.mad.lo.u32(r0, ty, C, c)
        base = reg.scalar(u64)
        ptx.inst.mul.wide.u32(base, r0, row_bytes)
        coff = reg.scalar(u64)
        ptx.inst.mul.wide.u32(coff, colc, cvec * 4)
        ptr = pp + base + coff
        acc = [reg.scalar(f32, init=0.0) for _ in range(cvec)]
        parts = ptx.scalar_param(u32, P, name="nparts")
        for r in ptx.loop(ty, parts, step):
            for u in range(unroll):
                pred = None
                if u:  # r < P holds for u == 0; later rows may pass P
                    pred = (r + u * ry) < parts
                vals = load_vec(ptr, u * ry * C * row_bytes, f32, cvec, pred=pred, cache=STREAM,
                                policy=hints.l2_load)
                for a, v in zip(acc, vals):
                    ptx.inst.add.f32(a, a, v)
            ptx.inst.add.u64(ptr, ptr, step * C * row_bytes)
        red = smem.alloc(f32, ry * WARP * cvec, name="slices")
        sbase = red.addr()
        mine = reg.scalar(u32)
        ptx.inst.mad.lo.u32(mine, ty, WARP * cvec * 4, sbase)
        mine = mine + tx * (cvec * 4)
        for i, a in enumerate(acc):
            ptx.inst.st.shared.f32(ptx.addr(mine, 4 * i), a)
        ptx.bar_sync(0)
        with ptx.if_(ty == 0):
            col_s = sbase + tx * (cvec * 4)
            tot = [reg.scalar(f32) for _ in range(cvec)]
            for i in range(cvec):
                ptx.inst.ld.shared.f32(tot[i], ptx.addr(col_s, 4 * i))
            for y in range(1, ry):
                for i in range(cvec):
                    v = reg.scalar(f32)
                    ptx.inst.ld.shared.f32(v, ptx.addr(col_s, (y * WARP * cvec + i) * 4))
                    ptx.inst.add.f32(tot[i], tot[i], v)
            ooff = reg.scalar(u64)
            ptx.inst.mul.wide.u32(ooff, colc, cvec * dtype.bytes)
            for ci, po in enumerate(pouts):
                if C == 1:
                    store_vec(po + ooff, 0, dtype, tot, pred=ok, cache=hints.store,
                              policy=hints.l2_store)
                else:
                    is_c = c == ci
                    pred = is_c if ok is None else (is_c & ok)
                    store_vec(po + ooff, 0, dtype, tot, pred=pred, cache=hints.store,
                              policy=hints.l2_store)
        ptx.ret()

    deco = kernel(in_specs=(Tile(P * C, N, f32),), out_specs=tuple(Tile(N, dtype) for _ in range(C)),
                  grid=(gx, C, 1), block=(WARP, ry, 1), name=name, arch=arch)
    if C == 1:
        def colsum(Part, Out):
            body(Part, (Out,))
    else:
        def colsum(Part, Out0, Out1):
            body(Part, (Out0, Out1))
    return deco(colsum)



class TwoStage:
    """A backward kernel (writing ``dx`` and partials) followed by ``build_colsum``.

    Looks like a kernel to ``pyptx.differentiable_kernel``: ``in_specs`` are the
    first stage's, ``out_specs`` are ``dx`` plus the summed gradients.
    """

    def __init__(self, stage1: Any, colsum: Any) -> None:
        self.stage1 = stage1
        self.colsum = colsum
        self.in_specs = stage1.in_specs
        self.out_specs = stage1.out_specs[:-1] + colsum.out_specs
        self.name = stage1.name
        self.arg_names = stage1.arg_names
        self.kernels = (stage1, colsum)

    def __call__(self, *args: Any) -> Any:
        """Run both stages: ``(*first outputs but the partials, *summed gradients)``."""
        outs = self.stage1(*args)
        *first, part = outs
        sums = self.colsum(part)
        sums = tuple(sums) if isinstance(sums, (tuple, list)) else (sums,)
        return (*first, *sums)

    def __repr__(self) -> str:
        return f"<TwoStage {self.stage1.name} -> {self.colsum.name}>"
