"""The GEMM's epilogue: ``D = act(alpha * acc + bias) (+ R)`` packed to the output type,
written as 128-byte-swizzled 64-row slabs into shared memory and stored with bulk tensor
copies (which clip the ragged edges). The gated form (``activation="swiglu"``) pairs each
64-column gate block of a tile with the up block after it and writes ``silu(g) * u``: half
the tile's columns."""

from __future__ import annotations

from pyptx import ptx, reg
from pyptx.rows.access import unpack
from pyptx.types import b32, f32
from pyptx.warpspec import store_slabs, swizzled_rows
from pyptx_kernels.gemm.config import ACTIVATIONS, GATE_BLOCK  # noqa: F401  (defined there)


def activate(v, activation):
    """``activation(v)`` of an f32 register (one of ``ACTIVATIONS``)."""
    if activation is None:
        return v
    assert activation != "swiglu", "the gated epilogue pairs registers: TileEpilogue._gated"
    if activation == "relu":
        out = reg.scalar(f32)
        ptx.inst.max.f32(out, v, 0.0)
        return out
    if activation == "silu":  # v * sigmoid(v) = v / (1 + 2^(-v * log2 e))
        t = v * -1.4426950408889634
        ex = reg.scalar(f32)
        ptx.inst.ex2.approx.ftz.f32(ex, t)
        den = ex + 1.0
        r = reg.scalar(f32)
        ptx.inst.rcp.approx.ftz.f32(r, den)
        return v * r
    # gelu (tanh form): 0.5 v (1 + tanh(0.7978845608 (v + 0.044715 v^3)))
    v3 = v * v * v
    inner = (v3 * 0.044715 + v) * 0.7978845608028654
    th = reg.scalar(f32)
    ptx.inst.tanh.approx.f32(th, inner)
    return (th + 1.0) * v * 0.5


class TileEpilogue:
    """A consumer warpgroup's epilogue of one tile, called as ``epilogue(m0, n0)``.

    The warpgroup's ``accs`` (one 64-row accumulator per band) go out one 64 x ``out_cols``
    slab at a time through ``cfg.epi_bufs`` buffers at ``cbuf`` (the bulk store of slab
    ``j - 1`` drains while slab ``j`` is written). A 16-bit output reaches shared memory by
    ``stmatrix.x4`` (one per four 8x8 blocks, ``cfg.epilogue == "stmatrix"``) or one
    ``st.shared.b32`` per column pair; an f32 output by ``st.shared.v2.f32``. Constructing
    it emits the per-thread addressing (swizzled rows, stmatrix rows, bias pointer,
    output tensor map). ``R``: the residual ``(M, N)`` of type ``rt`` (default: the output
    type), added last (``M`` an int or a u32 register: the kernel parameter of a runtime-M
    GEMM)."""

    def __init__(self, cfg, *, accs, ot, M, N, alpha, bias, activation, Bias, D, tid, lane, w,
                 row0, col0, cbuf, leader, bar_id, R=None, rt=None):
        self.cfg, self.accs, self.ot, self.M, self.N = cfg, accs, ot, M, N
        self.alpha, self.bias, self.activation = alpha, bias, activation
        self.gated = activation == "swiglu"
        self.w, self.row0, self.col0 = w, row0, col0
        self.cbuf, self.leader, self.bar_id = cbuf, leader, bar_id
        self.e_out = ot.bytes
        self.out_cols = 128 // self.e_out              # output columns per 128-byte slab
        self.out_slabs = cfg.BN // self.out_cols // (2 if self.gated else 1)
        self.sw = swizzled_rows(cbuf, row0, lane, self.e_out)
        self.rt = ot if rt is None else rt
        # stmatrix holds four packed pairs at a time: with f32 residual loads beside a
        # 16-bit output that spills (16 bytes at 128x256), so those store pair by pair
        self.use_stmatrix = cfg.epilogue == "stmatrix" and ot is not f32 and not self.gated \
            and self.rt is ot
        self.presid = ptx.global_ptrs(R)[0] if R is not None else None
        if self.use_stmatrix:
            # stmatrix.x4 of 8-column blocks (q, q+1), rows r and r+8: lane l gives row
            # l % 8 of matrix l // 8, i.e. tile row 16w + 8*((l//8) % 2) + l % 8 and block
            # q + l // 16, whose 16-byte chunk is swizzled by XOR with the row % 8 = l % 8
            mrow_t = ((tid & 96) >> 1) + ((lane >> 3) & 1) * 8 + (lane & 7)
            ybits = (lane >> 4) ^ (lane & 7)
            sm_rows = cbuf + mrow_t * 128
            self.smx = {q: ((ybits ^ q) << 4) + sm_rows for q in range(0, 8, 2)}
        if bias:
            (self.pbias,) = ptx.global_ptrs(Bias)
        self.d_map = ptx.tma.tensormap_ptr(D.tmap)

    def _scaled(self, acc, i, ncol, dc):
        """``alpha * acc[i..i+1] + bias`` of the register pair at tile column ``dc``."""
        v0, v1 = acc[i], acc[i + 1]
        if self.alpha != 1.0:
            v0 = v0 * float(self.alpha)
            v1 = v1 * float(self.alpha)
        if self.bias:
            N, c0 = self.N, ncol + dc
            b0 = reg.scalar(f32, init=0.0)
            b1 = reg.scalar(f32, init=0.0)
            ptx.inst.ld.global_.nc.f32(b0, ptx.addr(self.pbias + c0 * 4), pred=c0 < N)
            ptx.inst.ld.global_.nc.f32(b1, ptx.addr(self.pbias + c0 * 4 + 4), pred=c0 < N - 1)
            v0 = v0 + b0
            v1 = v1 + b1
        return v0, v1

    def _residual(self, v0, v1, row, col):
        """``(v0, v1) + R[row, col..col+1]`` (zeros past the edges: those are not stored)."""
        raw = reg.scalar(b32, init=0)
        ok = (row < self.M) & (col < self.N)
        off = (row * self.N + col) * self.rt.bytes
        if self.rt is f32:
            r0, r1 = reg.scalar(f32, init=0.0), reg.scalar(f32, init=0.0)
            ptx.inst.ld.global_.nc.v2.f32([r0, r1], ptx.addr(self.presid + off), pred=ok)
        else:
            ptx.inst.ld.global_.nc.b32(raw, ptx.addr(self.presid + off), pred=ok)
            r0, r1 = unpack([raw], self.rt)
        return v0 + r0, v1 + r1

    def _pairs(self, acc, j, ncol):
        """``(i, dr, oc, v0, v1)`` of each output pair of slab ``j`` of ``acc``: its output
        column ``oc`` in the tile and its two values (gated: ``silu(g) * u`` of the gate
        pair and the up pair ``GATE_BLOCK`` columns, 32 registers, later)."""
        out_cols = self.out_cols
        for i, dr, dc in acc.pairs():
            if self.gated:
                if dc // GATE_BLOCK % 2:
                    continue
                oc = dc // (2 * GATE_BLOCK) * GATE_BLOCK + dc % GATE_BLOCK
            else:
                oc = dc
            if oc // out_cols != j:
                continue
            v0, v1 = self._scaled(acc, i, ncol, dc)
            if self.gated:
                u0, u1 = self._scaled(acc, i + GATE_BLOCK // 2, ncol, dc + GATE_BLOCK)
                v0, v1 = activate(v0, "silu") * u0, activate(v1, "silu") * u1
            else:
                v0, v1 = activate(v0, self.activation), activate(v1, self.activation)
            yield i, dr, oc, v0, v1

    def _write(self, j, buf, ncol, mrow):
        """Slab ``j`` (band-major) of the accumulators into shared buffer ``buf``."""
        ot, e_out, out_cols = self.ot, self.e_out, self.out_cols
        packs = {}
        band, j = divmod(j, self.out_slabs)
        acc = self.accs[band]
        for i, dr, dc, v0, v1 in self._pairs(acc, j, ncol):
            if self.presid is not None:
                v0, v1 = self._residual(v0, v1, mrow + (band * 64 + dr) + self.row0,
                                        ncol + dc)
            q = dc % out_cols * e_out // 16  # the pair's 16-byte chunk, unswizzled
            off = buf + dr * 128
            if ot is f32:
                ptx.inst.st.shared.v2.f32(ptx.addr(self.sw[q], off), [v0, v1])
                continue
            packed = reg.scalar(b32)
            ptx.inst(f"cvt.rn.{ot.name}x2.f32")(packed, v1, v0)
            if not self.use_stmatrix:
                ptx.inst.st.shared.b32(ptx.addr(self.sw[q], off), packed)
                continue
            packs[i] = packed
            blk = i // 4 % 8  # the 8-column block within this slab
            if blk % 2 == 1 and i % 4 == 2:  # blocks blk-1, blk complete
                first = i - 6
                ptx.stmatrix(ptx.addr(self.smx[blk - 1], buf),
                             [packs[first], packs[first + 2], packs[first + 4],
                              packs[first + 6]], num=4)

    def __call__(self, m0, n0):
        cfg = self.cfg
        ncol = n0 + self.col0 if self.bias or self.presid is not None else None
        mrow = m0 + self.w * (64 * cfg.bands)
        n_out = n0 >> 1 if self.gated else n0   # the gated tile writes half its columns

        def coords(j):
            band, j = divmod(j, self.out_slabs)
            return n_out + j * self.out_cols, (mrow + band * 64 if band else mrow)

        store_slabs(self.out_slabs * cfg.bands, leader=self.leader, bar_id=self.bar_id,
                    cbuf=self.cbuf, tmap=self.d_map,
                    write=lambda j, buf: self._write(j, buf, ncol, mrow), bufs=cfg.epi_bufs,
                    coords=coords)
