"""The cross-entropy row kernel: per token, the loss of a row of logits and, in place, its
gradient (what ``linear_cross_entropy`` runs on each chunk's logits).

One CTA per row. Pass 1 walks the row in slabs of ``threads * unroll`` 16-byte vectors (a
device loop: vocabularies up to ``MAX_VOCAB``), each thread keeping a running max and a
rescaled sum of exponentials (and the sum of logits for label smoothing); the CTA then
all-reduces them (``pyptx.rows.Rows.reduce``) into ``lse = log(sum(exp(x)))``. Pass 2
re-reads the thread's own vectors (from L2 at the sizes of a chunk) and overwrites them
with the gradient of the row's loss, scaled by ``SCALE[0]``:
``scale * (softmax(x) * (1 + 2 z lse) - eps / V - (1 - eps) [i == target])``.
"""

from pyptx import SpecError, Tile, kernel, ptx, reg
from pyptx import rows as rw
from pyptx.types import b16, f32, s64, u32, u64
from pyptx_kernels._common import where
from pyptx_kernels.cross_entropy.config import DEFAULT, MAX_VOCAB, CrossEntropyConfig

LN2 = 0.6931471805599453


def build_cross_entropy_rows(T: int, V: int, dtype="bf16", *, ignore_index: int = -100,
                             label_smoothing: float = 0.0, z_loss: float = 0.0,
                             grad: bool = True, config: CrossEntropyConfig | None = None):
    """``(X, TARGET, SCALE) -> (LOSS, LSE)`` for logits ``X (T, V)`` in ``dtype`` (bf16 or
    f32), ``TARGET (T,)`` int64, ``SCALE (1,)`` f32; ``LOSS``/``LSE (T,)`` f32.

    ``LOSS[r] = lse - (1 - eps) x[t] - eps * mean(x) + z * lse**2`` (``eps`` the label
    smoothing, ``z`` the z-loss weight, ``t = TARGET[r]``), 0 where ``t == ignore_index``
    (a target outside ``[0, V)`` reads its logit as 0). ``grad=True``: ``X`` is overwritten
    with ``SCALE[0] * dLOSS[r]/dX`` (0 on ignored rows), the launch writing into its input.
    Supported: ``T >= 1``, ``1 <= V <= 2**20``. Tolerance against float64: loss 1e-6
    relative, gradient to the storage type's rounding."""
    who = "build_cross_entropy_rows"
    c = DEFAULT if config is None else config
    if not isinstance(c, CrossEntropyConfig):
        raise SpecError(f"{where()}: {who}: config must be a CrossEntropyConfig, got {c!r}")
    dt = rw.dtype_of(dtype, who)
    for name, v in (("T", T), ("V", V)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise SpecError(f"{where()}: {who}: {name} must be a positive int, got {v!r}")
    if V > MAX_VOCAB or T >= 2**31:
        raise SpecError(f"{where()}: {who}: V must be at most {MAX_VOCAB} and T below 2**31, "
                        f"got T={T}, V={V}")
    es = dt.bytes
    vec = 16 // es
    while V % vec:
        vec //= 2
    threads, unroll = c.threads, c.unroll
    slab = threads * vec * unroll
    nslab = -(-V // slab)
    ragged = V % slab != 0
    plan = rw.RowPlan(T, V, dt, vec, threads, unroll, 1)
    eps, z = float(label_smoothing), float(z_loss)
    L = rw.LOG2E

    @kernel(
        in_specs=(Tile(T, V, dt), Tile(T, s64), Tile(1, f32)),
        out_specs=(Tile(T, f32), Tile(T, f32)),
        grid=(T, 1, 1),
        block=(threads, 1, 1),
        name=f"cross_entropy_rows{'' if grad else '_fwd'}_{dt.name}",
    )
    def cross_entropy_rows(X, TGT, SCALE, LOSS, LSE):
        px, pt, ps, pl, plse = ptx.global_ptrs(X, TGT, SCALE, LOSS, LSE)
        io = rw.Rows(plan)
        row = ptx.special.ctaid.x()
        t = io.t
        roff = reg.scalar(u64)
        ptx.inst.mul.wide.u32(roff, row, V * es)
        prow = px + roff
        tid_e = reg.scalar(u32)  # this thread's first element within a slab
        ptx.inst.mul.lo.u32(tid_e, t, vec)

        def chunks(it):
            """(address, first element index, predicate) of each of the thread's vectors in
            slab ``it``."""
            out = []
            for j in range(unroll):
                e = reg.scalar(u32)
                ptx.inst.mad.lo.u32(e, it, slab, tid_e)
                if j:
                    ptx.inst.add.u32(e, e, j * threads * vec)
                eb = reg.scalar(u64)
                ptx.inst.mul.wide.u32(eb, e, es)
                out.append((prow + eb, e, (e < V) if ragged else None))
            return out

        m = reg.scalar(f32, init=rw.NEG_INF)
        s = reg.scalar(f32, init=0.0)
        sx = reg.scalar(f32, init=0.0)
        for it in ptx.loop(0, nslab, 1, unroll=False):
            vals = []
            parts = []
            for a, _, p in chunks(it):
                v = rw.load_vec(a, 0, dt, vec, pred=p, fill=rw.NEG_INF)
                vals += v
                parts.append((v, p))
            mx = rw.tree(vals, "max")
            mn = reg.scalar(f32)
            ptx.inst.max.f32(mn, m, mx)
            msafe = reg.scalar(f32)  # -inf (a thread with no element yet) scales by 0
            ptx.inst.selp.f32(msafe, 0.0, mn, mn == rw.NEG_INF)
            nml = reg.scalar(f32)
            ptx.inst.mul.f32(nml, msafe, -L)
            r = reg.scalar(f32)
            ptx.inst.fma.rn.f32(r, m, L, nml)
            ptx.inst.ex2.approx.ftz.f32(r, r)
            es_ = []
            for v in vals:
                y = reg.scalar(f32)
                ptx.inst.fma.rn.f32(y, v, L, nml)
                ptx.inst.ex2.approx.ftz.f32(y, y)
                es_.append(y)
            ptx.inst.fma.rn.f32(s, s, r, rw.tree(es_, "add"))
            ptx.inst.mov.f32(m, mn)
            if eps:
                for v, p in parts:
                    ptx.inst.add.f32(sx, sx, rw.tree(v, "add"), pred=p)
        mt = reg.scalar(f32)
        ptx.inst.mov.f32(mt, m)
        io.reduce([m], "max")
        sc = reg.scalar(f32)  # this thread's sum rescaled to the row's max
        ptx.inst.sub.f32(sc, mt, m)
        ptx.inst.mul.f32(sc, sc, L)
        ptx.inst.ex2.approx.ftz.f32(sc, sc)
        ptx.inst.mul.f32(s, s, sc)
        io.reduce([s, sx] if eps else [s])
        lse = reg.scalar(f32)
        ptx.inst.lg2.approx.ftz.f32(lse, s)
        ptx.inst.fma.rn.f32(lse, lse, LN2, m)

        tgt = reg.scalar(s64)
        toff = reg.scalar(u64)
        ptx.inst.mul.wide.u32(toff, row, 8)
        ptx.inst.ld.global_.s64(tgt, ptx.addr(pt + toff))
        t32 = reg.scalar(u32)
        ptx.inst.cvt.u32.s64(t32, tgt)
        valid = tgt != ignore_index
        inside = valid & (t32 < V)
        xt = reg.scalar(f32, init=0.0)
        if dt is f32:
            toffb = reg.scalar(u64)
            ptx.inst.mul.wide.u32(toffb, t32, 4)
            ptx.inst.ld.global_.f32(xt, ptx.addr(prow + toffb), pred=inside)
        else:
            h = reg.scalar(b16)
            toffb = reg.scalar(u64)
            ptx.inst.mul.wide.u32(toffb, t32, 2)
            ptx.inst.ld.global_.b16(h, ptx.addr(prow + toffb), pred=inside)
            ptx.inst.cvt.f32.bf16(xt, h, pred=inside)
        loss = reg.scalar(f32)
        ptx.inst.fma.rn.f32(loss, xt, -(1.0 - eps), lse)
        if eps:
            ptx.inst.fma.rn.f32(loss, sx, -eps / V, loss)
        if z:
            zz = reg.scalar(f32)
            ptx.inst.mul.f32(zz, lse, lse)
            ptx.inst.fma.rn.f32(loss, zz, z, loss)
        ptx.inst.selp.f32(loss, loss, 0.0, valid)
        lead = t == 0
        ooff = reg.scalar(u64)
        ptx.inst.mul.wide.u32(ooff, row, 4)
        ptx.inst.st.global_.f32(ptx.addr(pl + ooff), loss, pred=lead)
        ptx.inst.st.global_.f32(ptx.addr(plse + ooff), lse, pred=lead)
        if not grad:
            ptx.ret()
            return

        scale = reg.scalar(f32)
        ptx.inst.ld.global_.nc.f32(scale, ptx.addr(ps))
        ptx.inst.selp.f32(scale, scale, 0.0, valid)
        cp = reg.scalar(f32)  # scale * (1 + 2 z lse): the softmax term's factor
        if z:
            ptx.inst.fma.rn.f32(cp, lse, 2.0 * z, 1.0)
            ptx.inst.mul.f32(cp, cp, scale)
        else:
            ptx.inst.mov.f32(cp, scale)
        cu = reg.scalar(f32)  # scale * eps / V: the uniform term
        ptx.inst.mul.f32(cu, scale, eps / V)
        ct = reg.scalar(f32)  # scale * (1 - eps): the target's term
        ptx.inst.mul.f32(ct, scale, 1.0 - eps)
        nll = reg.scalar(f32)
        ptx.inst.mul.f32(nll, lse, -L)
        for it in ptx.loop(0, nslab, 1, unroll=False):
            for a, e, p in chunks(it):
                v = rw.load_vec(a, 0, dt, vec, pred=p, fill=rw.NEG_INF)
                rel = reg.scalar(u32)
                ptx.inst.sub.u32(rel, t32, e)
                gs = []
                for k, x in enumerate(v):
                    g = reg.scalar(f32)
                    ptx.inst.fma.rn.f32(g, x, L, nll)
                    ptx.inst.ex2.approx.ftz.f32(g, g)
                    ptx.inst.mul.f32(g, g, cp)
                    if eps:
                        ptx.inst.sub.f32(g, g, cu)
                    ptx.inst.sub.f32(g, g, ct, pred=rel == k)
                    gs.append(g)
                rw.store_vec(a, 0, dt, gs, pred=p)
        ptx.ret()

    cross_entropy_rows.geometry = dict(vec=vec, threads=threads, unroll=unroll, slabs=nslab)
    return cross_entropy_rows


__all__ = ["build_cross_entropy_rows"]
