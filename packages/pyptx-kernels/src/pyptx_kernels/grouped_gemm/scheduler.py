"""The grouped kernels' work decomposition: the forward's persistent walk over the tiles of
ragged groups (``RaggedTiles``, read from the device-side group ends as it goes), its guess
of a CTA's first tile, and the weight gradient's fixed tiles, split units and row-block runs.

The host's part (``forward_units``, the CPU models) imports no tracing code: what emits code
imports it (a kernel built from its family's stored code never does)."""

from __future__ import annotations

from pyptx.types import u32, u64


def _mov(dst, src):
    """``mov`` of ``src`` into the existing register ``dst`` (a loop-carried value)."""
    from pyptx import ptx

    ptx.inst(f"mov.b{dst.type.bits}")(dst, src)


def _min_max(x, lo, hi):
    """``max(min(x, hi), lo)`` for u32 registers."""
    from pyptx import ptx, reg

    m = reg.scalar(u32)
    ptx.inst.min.u32(m, x, hi)
    out = reg.scalar(u32)
    ptx.inst.max.u32(out, m, lo)
    return out


class RaggedTiles:
    """The persistent walk over the tiles of ragged groups, as loop-carried registers.

    Group ``g`` covers rows ``[start, end)`` (``end = offs[g]`` clamped to
    ``[start, M]``) and tiles ``[first, stop)`` of the global tile order:
    ``ceil((end - start) / BM)`` m-blocks times ``num_n`` n-blocks, m-block fastest.
    ``seek(t)`` moves forward (``t`` never decreases) until the current group holds
    tile ``t`` or every group is read; then ``t >= stop`` means the walk is over.
    """

    def __init__(self, offs_ptr, G, M, BM, num_n):
        from pyptx import reg

        self.p, self.G, self.M, self.BM, self.num_n = offs_ptr, G, M, BM, num_n
        self.shift = BM.bit_length() - 1
        self.read = reg.scalar(u32, init=0)   # groups read so far (the current one is read - 1)
        self.start = reg.scalar(u32, init=0)
        self.end = reg.scalar(u32, init=0)
        self.first = reg.scalar(u32, init=0)
        self.stop = reg.scalar(u32, init=0)

    def blocks(self):
        """m-blocks of the current group."""
        return (self.end - self.start + (self.BM - 1)) >> self.shift

    def seek(self, t):
        """Advance to the group that holds tile ``t`` (emits a device while-loop)."""
        from pyptx import ptx, reg

        with ptx.while_(lambda: (t >= self.stop) & (self.read < self.G)):
            _mov(self.start, self.end)
            raw = reg.scalar(u32)
            ptx.inst.ld.global_.nc.u32(raw, ptx.addr(self.p + reg.from_(self.read, u64) * 4))
            _mov(self.end, _min_max(raw, self.start, self.M))
            _mov(self.first, self.stop)
            self.stop += self.blocks() * self.num_n
            self.read += 1

    def done(self, t):
        """Predicate: tile ``t`` lies past the last group (call after ``seek(t)``)."""
        return t >= self.stop

    def tile(self, t, BN):
        """``(g, m0, n0)`` registers of tile ``t`` (after ``seek(t)``, when not done)."""
        local = t - self.first
        nblk = self.blocks()
        mb = local % nblk
        nb = local // nblk
        return self.read - 1, self.start + (mb << self.shift), nb * BN


def uniform_guess(t, *, M, G, BM, BN, num_n):
    """``(g, m0, n0)`` of unit ``t`` of the ``RaggedTiles`` order (m-block fastest, then
    n-block, then group) if each of the ``G`` groups had ``M // G`` rows; ``t`` and ``M``
    Python ints (a CPU model) or u32 registers (in a kernel; ``M`` the kernel parameter)."""
    rows = M // G
    if isinstance(rows, int):
        blocks = max(1, -(-rows // BM))
    else:
        from pyptx import ptx, reg

        blocks = reg.scalar(u32)
        ptx.inst.max.u32(blocks, (rows + (BM - 1)) // BM, 1)
    per = blocks * num_n
    g = t // per
    local = t - g * per
    return g, g * rows + local % blocks * BM, local // blocks * BN


def group_rows(p_offs, g, M):
    """``(start, end)`` u32 registers of group ``g``'s rows (clamped to ``[0, M]``)."""
    from pyptx import ptx, reg

    start = reg.scalar(u32, init=0)
    ptx.inst.ld.global_.nc.u32(start, ptx.addr(p_offs + reg.from_(g, u64) * 4 - 4), pred=g != 0)
    start = _min_max(start, 0, M)
    raw = reg.scalar(u32)
    ptx.inst.ld.global_.nc.u32(raw, ptx.addr(p_offs + reg.from_(g, u64) * 4))
    return start, _min_max(raw, start, M)


def wgrad_unit(u, tiles, splits):
    """``(tile, split)`` registers of the weight gradient's work unit ``u`` (split-major:
    split ``u // tiles`` of tile ``u % tiles``); ``(u, None)`` when ``splits == 1``."""
    if splits == 1:
        return u, None
    s = u // tiles
    return u - s * tiles, s


def split_blocks(s, start, end, splits, BK=64):
    """``(kb_lo, kb_hi)``: split ``s``'s run of the ``nkb = ceil((end - start) / BK)`` row
    blocks of a group, ``floor(nkb * s / splits)`` up to ``floor(nkb * (s + 1) / splits)``
    (all of them, ``(0, nkb)``, when ``s`` is None). The runs of ``s = 0..splits-1`` tile
    ``[0, nkb)`` in order; a run may be empty (then the split's partial sum is zero)."""
    nkb = (end - start + (BK - 1)) >> (BK.bit_length() - 1)
    if s is None:
        return 0, nkb
    return (nkb * s) // splits, (nkb * (s + 1)) // splits


def forward_units(M, N, G, BM, BN, cluster, along_m, num_sms):
    """``(unit_m, unit_n, num_n, clusters)`` of the forward walk: a scheduling unit is one
    cluster's rows and columns (``cluster`` m-blocks when ``along_m``, else n-blocks), ``num_n``
    its n-blocks, and ``clusters`` the persistent clusters (no more than the units there can be
    for any group sizes). The kernel's walk strides by ``num_sms // cluster`` whatever
    ``clusters`` is: with fewer clusters each has at most one unit, so the stride only ends
    its walk, and the PTX does not depend on M."""
    along_n = cluster > 1 and not along_m
    unit_m = BM * cluster if along_m else BM     # rows of one scheduling unit
    unit_n = BN * cluster if along_n else BN     # columns of one
    num_n = -(-N // unit_n)
    max_tiles = (-(-M // unit_m) + G) * num_n
    return unit_m, unit_n, num_n, max(1, min(num_sms // cluster, max_tiles))


def wgrad_tile(t, per_group, num_m, BM, BN):
    """``(g, m0, n0)`` of the weight gradient's tile ``t``: ``per_group`` tiles per group,
    m-block fastest over ``num_m`` m-blocks."""
    g = t // per_group
    within = t - g * per_group
    mb = within % num_m
    nb = within // num_m
    return g, mb * BM, nb * BN
