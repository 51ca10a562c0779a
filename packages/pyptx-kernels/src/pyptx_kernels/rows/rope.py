"""Rotary position embedding of q and k in one launch, in transformers' ``rotate_half``
convention: ``out = x * cos + rotate_half(x) * sin`` with ``rotate_half(x) = cat(-x2, x1)``
(``x1``, ``x2`` the halves of the head dimension) and per-position ``cos``/``sin``.

Every ``(batch, head, position)`` vector of q and of k is a row of ``D`` elements; thread
``t`` of a row owns the ``t``-th 16-byte chunk of each half, so it holds both elements every
output needs and no data crosses threads. The first CTAs rotate q's rows, the rest k's (one
uniform branch on the CTA index). ``transpose=True`` applies the transposed rotation (the
backward): ``dx1 = g1 * cos1 + g2 * sin2``, ``dx2 = g2 * cos2 - g1 * sin1``.
"""

from pyptx import SpecError, Tile, kernel
from pyptx import rows as rw
from pyptx.types import f32, u32, u64
from pyptx_kernels._common import where

#: memory orders of q and k: ``(B, H, S, D)`` or ``(B, S, H, D)``
LAYOUTS = ("bhsd", "bshd")
#: threads per CTA the rows are packed into (at least one row per CTA)
CTA_THREADS = 256


def build_rope(B: int, Hq: int, Hk: int, S: int, D: int, dtype=f32, *, cos_batch: int = 1,
               layout: str = "bhsd", transpose: bool = False, pdl: bool = True):
    """``(Q, K, COS, SIN) -> (QO, KO)``: q ``(B, Hq, S, D)`` and k ``(B, Hk, S, D)`` (or
    ``(B, S, H, D)`` with ``layout="bshd"``) rotated by ``COS``/``SIN (cos_batch, S, D)``
    (``cos_batch`` 1: one table for every sequence; ``B``: one per sequence), all dense, in
    ``dtype`` (f32 or bf16), f32 arithmetic; the outputs are shaped like q and k.

    Row shape: ``D / 2 / vec`` threads per row (``vec``: 16-byte chunks, narrowed to divide
    ``D / 2``), rows packed into CTAs of about 256 threads; every load of a CTA is issued
    before the first product. ``cos``/``sin`` are read with ``ld.global.nc`` (each row of them
    is shared by all heads of a position). Reads ``2`` and writes ``1`` element per element of
    q and k, plus the tables. Supported: even ``D`` up to 1024, any ``B, H, S >= 1`` with
    fewer than ``2**31`` rows. Tolerance against float64: relative L2 error below 1e-6
    (f32) / 1e-2 (bf16)."""
    who = "build_rope"
    dt = rw.dtype_of(dtype, who)
    for name, v in (("B", B), ("Hq", Hq), ("Hk", Hk), ("S", S), ("D", D),
                    ("cos_batch", cos_batch)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise SpecError(f"{where()}: {who}: {name} must be a positive int, got {v!r}")
    if D % 2 or D > 1024:
        raise SpecError(f"{where()}: {who}: D must be even and at most 1024, got {D}")
    if cos_batch not in (1, B):
        raise SpecError(f"{where()}: {who}: cos_batch must be 1 or B={B}, got {cos_batch}")
    if layout not in LAYOUTS:
        raise SpecError(f"{where()}: {who}: layout must be one of {LAYOUTS}, got {layout!r}")
    es = dt.bytes
    half = D // 2
    vec = 16 // es
    while half % vec:
        vec //= 2
    tpr = half // vec
    R = max(1, CTA_THREADS // tpr)
    nq, nk = B * Hq * S, B * Hk * S
    if nq + nk >= 2**31:
        raise SpecError(f"{where()}: {who}: q and k have {nq + nk} rows, at most 2**31 - 1")
    cq, ck = -(-nq // R), -(-nk // R)

    def rows(P, n, H, po, pcos, psin, cta, tid):
        """Rotate the ``n`` rows of one tensor at ``P``/``po`` (``H`` heads); ``cta`` counts
        from this tensor's first CTA."""
        from pyptx import ptx, reg  # the tracing layer: loaded at the first trace
        row = reg.scalar(u32)
        g = reg.scalar(u32)
        t = reg.scalar(u32)
        ptx.inst.div.u32(g, tid, tpr)
        ptx.inst.rem.u32(t, tid, tpr)
        ptx.inst.mad.lo.u32(row, cta, R, g)
        ok = row < n if n % R else None
        if ok is not None:
            ptx.inst.min.u32(row, row, n - 1)
        pos = reg.scalar(u32)   # position s of the row
        seq = reg.scalar(u32)   # batch index b
        if layout == "bhsd":
            ptx.inst.rem.u32(pos, row, S)
        else:
            ptx.inst.div.u32(pos, row, H)
            ptx.inst.rem.u32(pos, pos, S)
        crow = pos
        if cos_batch > 1:
            ptx.inst.div.u32(seq, row, H * S)
            crow = reg.scalar(u32)
            ptx.inst.mad.lo.u32(crow, seq, S, pos)
        col = reg.scalar(u64)
        ptx.inst.mul.wide.u32(col, t, vec * es)
        xoff, coff = reg.scalar(u64), reg.scalar(u64)
        ptx.inst.mul.wide.u32(xoff, row, D * es)
        ptx.inst.mul.wide.u32(coff, crow, D * es)
        xoff, coff = xoff + col, coff + col
        hb = half * es
        ax, ac, as_ = P + xoff, pcos + coff, psin + coff
        x1 = rw.load_vec(ax, 0, dt, vec)
        x2 = rw.load_vec(ax, hb, dt, vec)
        c1 = rw.load_vec(ac, 0, dt, vec, cache=rw.KEEP)
        c2 = rw.load_vec(ac, hb, dt, vec, cache=rw.KEEP)
        s1 = rw.load_vec(as_, 0, dt, vec, cache=rw.KEEP)
        s2 = rw.load_vec(as_, hb, dt, vec, cache=rw.KEEP)
        o1, o2 = [], []
        for a, b, ca, cb, sa, sb in zip(x1, x2, c1, c2, s1, s2):
            u, v = reg.scalar(f32), reg.scalar(f32)
            ptx.inst.mul.f32(u, a, ca)
            ptx.inst.mul.f32(v, b, cb)
            if transpose:   # dx1 = g1 c1 + g2 s2, dx2 = g2 c2 - g1 s1
                ptx.inst.fma.rn.f32(u, b, sb, u)
                ptx.inst.fma.rn.f32(v, -a, sa, v)
            else:           # y1 = x1 c1 - x2 s1, y2 = x2 c2 + x1 s2
                ptx.inst.fma.rn.f32(u, -b, sa, u)
                ptx.inst.fma.rn.f32(v, a, sb, v)
            o1.append(u)
            o2.append(v)
        ao = po + xoff
        rw.store_vec(ao, 0, dt, o1, pred=ok)
        rw.store_vec(ao, hb, dt, o2, pred=ok)

    def qk(H):   # q/k as they lie in memory
        return Tile(B, H, S, D, dt) if layout == "bhsd" else Tile(B, S, H, D, dt)

    @kernel(
        in_specs=(qk(Hq), qk(Hk), Tile(cos_batch, S, D, dt), Tile(cos_batch, S, D, dt)),
        out_specs=(qk(Hq), qk(Hk)),
        grid=(cq + ck, 1, 1),
        block=(R * tpr, 1, 1),
        name=f"rope{'_bwd' if transpose else ''}_{dt.name}",
        pdl=pdl,
    )
    def rope(Q, K, COS, SIN, QO, KO):
        from pyptx import ptx, reg  # the tracing layer: loaded at the first trace
        with rw.entry(pdl):
            pq, pk, pc, ps, pqo, pko = ptx.global_ptrs(Q, K, COS, SIN, QO, KO)
            cta = ptx.special.ctaid.x()
            tid = ptx.special.tid.x()
        on_k = ptx.label("k_rows")
        ptx.bra(on_k, pred=cta >= cq, uni=True)
        rows(pq, nq, Hq, pqo, pc, ps, cta, tid)
        ptx.ret()
        ptx.place(on_k)
        kc = reg.scalar(u32)
        ptx.inst.sub.u32(kc, cta, cq)
        rows(pk, nk, Hk, pko, pc, ps, kc, tid)
        ptx.ret()

    rope.geometry = dict(vec=vec, threads_per_row=tpr, rows=R, grid=cq + ck)
    return rope


def reference(x, cos, sin, transpose=False):
    """The rotation of one array of rows (nested lists, float64): ``x * cos + rotate_half(x) *
    sin`` row by row with the matching rows of ``cos``/``sin``; ``transpose``: its transpose."""
    out = []
    for r, c, s in zip(x, cos, sin):
        h = len(r) // 2
        if transpose:
            out.append([r[i] * c[i] + r[i + h] * s[i + h] for i in range(h)]
                       + [r[i + h] * c[i + h] - r[i] * s[i] for i in range(h)])
        else:
            out.append([r[i] * c[i] - r[i + h] * s[i] for i in range(h)]
                       + [r[i + h] * c[i + h] + r[i] * s[i + h] for i in range(h)])
    return out


__all__ = ["LAYOUTS", "build_rope", "reference"]
