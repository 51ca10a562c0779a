"""A tiny PTX interpreter for CPU tests of the row-wise example kernels.

It runs the subset of PTX those kernels emit (integer and f32 arithmetic,
bf16 conversions, predicated vector ``ld``/``st`` on global and shared
memory, ``shfl.sync.bfly``, ``bar.sync``, branches) one CTA at a time, all
threads of the CTA as numpy vectors. Threads advance in SIMT fashion: each
step runs the instruction at the smallest program counter among the live
threads for every thread sitting there, which reconverges structured code.

It checks what a GPU would only show as wrong results or faults: every global
access must fall inside one argument buffer and be aligned to its size,
``bar.sync`` must be reached by every live thread of the CTA, a shuffle needs
all 32 lanes of its warp, and registers must be written before they are read.
Approximate instructions (``rsqrt``/``ex2``/``rcp``) are computed exactly, so
results match a float64 reference to f32 rounding.

Bulk copies and mbarriers (the TMA-ring kernels): the ``.extern .shared`` window
follows the static variables and has the kernel's dynamic ``smem`` bytes. Each
mbarrier (by shared address) keeps its arrival count, pending arrivals, tx count
and completed phases; a phase completes when pending arrivals and tx count are
both 0. ``cp.async.bulk`` copies run when issued (16-byte aligned, a positive
multiple of 16 bytes, inside one argument buffer and one shared variable):
global -> shared then completes its bytes on its mbarrier, shared -> global
counts as a write of the output. ``try_wait.parity P`` is true once the
barrier's current phase parity differs from ``P``; a thread whose wait fails in
a spin loop (``L: try_wait p; @!p bra L``) parks until some phase completes,
and when every live thread is parked the run fails as a deadlock.

Ordering checks around the async proxy: a thread reads (or overwrites) bytes a
bulk copy filled only after a wait of its own saw that copy's phase complete; a
bulk copy overwrites no shared bytes read (or written by another thread) since
the last ``bar.sync``; a bulk store's source was written before a ``bar.sync``
(or by the issuing thread) and fenced with ``fence.proxy.async`` by its writers;
nothing overwrites a bulk store's source before its issuer's
``cp.async.bulk.wait_group{.read}`` retired the group, and no thread exits with
bulk groups outstanding. Threads order their accesses only through ``bar.sync``
(which also shares what each thread saw of the mbarriers) and mbarrier waits.
Clusters (along x) run their CTAs together: each CTA has its own shared window, ``mapa``
gives a cluster address into another's, multicast copies write every CTA of their mask and
complete bytes on each one's mbarrier, ``barrier.cluster.wait`` needs every live thread of
the cluster, ``bar.sync`` only the CTA's own.
Tensor-core kernels: tensor maps are the
``Specialization``'s ``tma_maps`` (a ``.param .b8 X_tmap[128]`` names one); tile copies
(``cp.async.bulk.tensor``) gather their box with zero fill past the tensor's edges and
write it swizzled by shared address (128/64/32-byte modes: address bits 4.. XOR bits
7..), tile stores scatter a box back, clipped at the edges, with the bulk stores' checks.
``wgmma.mma_async`` runs at issue for the whole warpgroup: it decodes both matrix
descriptors (start, LBO, SBO, swizzle) into the ISA's canonical K-major / MN-major
layouts, reads shared memory (each byte a copy filled needs a wait of the reading thread
that saw it complete) and updates the f32 accumulator fragment; ``wgmma.fence`` /
``commit_group`` / ``wait_group`` are then no-ops. ``ldmatrix`` / ``stmatrix`` (``.x1/.x2/.x4``,
``.trans``) writes 8x8 b16 matrices from the fragment layout. ``mma.sync`` (m16n8k8 /
m16n8k16, bf16/f16 inputs, f32 or f16 C/D, ``.row.col``) gathers each warp's fragments and
computes at issue. ``cp.async`` (4/8/16 bytes, ``src_size`` zero fill) copies at issue; its
bytes are in flight until the issuing thread's ``cp.async.wait_group``/``wait_all`` retires
their group, then visible to that thread, and to the others after a ``bar.sync``: reading
them earlier, or refilling bytes read since the last ``bar.sync``, fails. Named barriers
(``bar.sync id, n`` / ``bar.arrive id, n``) complete when ``n`` threads arrived; threads
that wait park. ``setmaxnreg`` is a no-op.
Blackwell ``tcgen05`` (untested on hardware, so this model is the only check): each CTA has
tensor memory of 128 lanes x 512 32-bit columns (unwritten cells fail when read);
``tcgen05.alloc`` (a whole warp) takes the first free run of ``ncols`` columns aligned to
``ncols`` and writes ``column`` (lane 0) to its shared slot, ``dealloc`` frees exactly an
allocation, ``alloc`` after ``relinquish_alloc_permit`` fails, and a CTA that exits with
columns allocated fails. ``tcgen05.mma`` (kind::f16 / tf32 / f8f6f4, f32 D, dense; one thread
of a CTA issues it) runs at issue: it decodes the instruction descriptor and both
version-1 shared-memory descriptors (a wgmma descriptor fails), reads A (M x K) and B (N x K)
like ``wgmma`` and writes D row ``i`` to lane ``lane(d) + i``, columns ``col(d)..+N``, of
allocated columns (M 128, cta_group::1; with cta_group::2, M 256 from the even CTA of a pair:
each CTA holds 128 rows of A and N/2 rows of B at the same descriptor addresses, and gets its
128 rows of D). ``tcgen05.commit`` arrives once on the mbarrier (with ``.multicast::cluster``
on the one at that offset in each CTA of the mask). ``tcgen05.ld``/``st`` ``32x32b.xN`` (a
whole warp, which reaches lanes ``32 * (warp % 4)`` .. ``+31``) move lane ``+ laneid``,
columns ``..+N``; waits and fences are no-ops; other shapes, ``cp`` and ``shift`` fail.
Not a PTX model beyond that: no memory ordering of ordinary accesses, and a ring refill is
ordered by "its issuer waited for an mbarrier phase that completed after the reads" (not a
full happens-before); wgmma's shared-memory reads are not tracked for refills at all.
"""

from __future__ import annotations

import re
import struct

import numpy as np

__all__ = ["run", "SimError"]


class SimError(AssertionError):
    """The kernel did something a GPU would fault on or that PTX leaves undefined."""


_REG_DECL = re.compile(r"^\.reg\s+\.(\w+)\s+(%[A-Za-z_]+)<(\d+)>;")
_SHARED = re.compile(r"^\.shared\s+\.align\s+(\d+)\s+\.(\w+)\s+(\w+)(?:\[(\d+)\])?;")
_EXTERN = re.compile(r"^\.extern\s+\.shared\s+\.align\s+(\d+)\s+\.(\w+)\s+(\w+)\[\];")
_PARAM = re.compile(r"^\.param\s+\.(\w+)\s+(\w+),?$")
_BITS = {"pred": 0, "b16": 16, "u16": 16, "s16": 16, "f16": 16, "bf16": 16, "b32": 32,
         "u32": 32, "s32": 32, "f32": 32, "b64": 64, "u64": 64, "s64": 64, "f64": 64, "b8": 8}
_BITS["f16x2"] = 32  # packed f16 pairs (pack_f16x2, mma.sync f16 accumulators)
_NP = {16: np.uint16, 32: np.uint32, 64: np.uint64, 8: np.uint8}
_SPECIAL = ("%tid.x", "%tid.y", "%tid.z", "%ctaid.x", "%ctaid.y", "%ctaid.z", "%ntid.x",
            "%ntid.y", "%ntid.z", "%nctaid.x", "%nctaid.y", "%nctaid.z", "%laneid",
            "%cluster_ctarank", "%cluster_nctarank", "%clusterid.x", "%smid",
            "%globaltimer_lo")  # the last two read 0 (one SM, no clock)
_GLOBAL_BASE = 1 << 40
_GLOBAL_STRIDE = 1 << 36
_TMAP_BASE = 1 << 32  # generic addresses of the tensor-map parameters (256 bytes apart)
_CLUSTER_TAG = 1 << 30  # a mapa result: the bits below are a cluster-wide (physical) address
_TMAP_PARAM = re.compile(r"^\.param\s+\.align\s+\d+\s+\.b8\s+(\w+)\[128\],?$")
_DTYPE_BYTES = {"UINT8": 1, "UINT16": 2, "UINT32": 4, "INT32": 4, "UINT64": 8, "INT64": 8,
                "FLOAT16": 2, "FLOAT32": 4, "FLOAT64": 8, "BFLOAT16": 2, "FLOAT32_FTZ": 4,
                "TFLOAT32": 4, "TFLOAT32_FTZ": 4}


def _split_operands(text: str) -> list[str]:
    out, depth, cur = [], 0, ""
    for ch in text:
        if ch in "{[":
            depth += 1
        elif ch in "}]":
            depth -= 1
        if ch == "," and depth == 0:
            out.append(cur.strip())
            cur = ""
        else:
            cur += ch
    if cur.strip():
        out.append(cur.strip())
    return out


class _Prog:
    def __init__(self, text: str, dynamic_smem: int = 0) -> None:
        self.regtype: dict[str, str] = {}
        self.shared: dict[str, int] = {}
        #: (start, end, name) of each shared variable; the dynamic window last
        self.shared_vars: list[tuple[int, int, str]] = []
        self.shared_bytes = 0
        externs: list[tuple[str, int]] = []
        self.params: list[str] = []
        self.tmaps: list[str] = []
        self.code: list[tuple] = []
        self.labels: dict[str, int] = {}
        in_params = False
        for raw in text.splitlines():
            line = raw.strip()
            if not line or line.startswith("//"):
                continue
            if line.startswith(".visible .entry"):
                in_params = line.endswith("(")
                continue
            if in_params:
                if line == ")":
                    in_params = False
                elif m := _PARAM.match(line):
                    self.params.append(m.group(2))
                elif m := _TMAP_PARAM.match(line):
                    self.tmaps.append(m.group(1))
                continue
            if m := _REG_DECL.match(line):
                self.regtype[m.group(2)] = m.group(1)
                continue
            if m := _SHARED.match(line):
                align, t, name, count = int(m.group(1)), m.group(2), m.group(3), m.group(4)
                size = max(_BITS[t] // 8, 1) * int(count or 0)
                self.shared_bytes = -(-self.shared_bytes // align) * align
                self.shared[name] = self.shared_bytes
                self.shared_vars.append((self.shared_bytes, self.shared_bytes + size, name))
                self.shared_bytes += size
                continue
            if m := _EXTERN.match(line):
                externs.append((m.group(3), int(m.group(1))))
                continue
            if line.startswith((".", "{", "}")):
                continue
            if line.endswith(":"):
                self.labels[line[:-1]] = len(self.code)
                continue
            line = line.rstrip(";")
            guard = None
            if line.startswith("@"):
                g, line = line.split(None, 1)
                guard = (g[1:].lstrip("!"), g.startswith("@!"))
            parts = line.split(None, 1)
            opcode = parts[0]
            ops = _split_operands(parts[1]) if len(parts) > 1 else []
            self.code.append((guard, opcode, ops, raw.strip()))
        if externs:  # every extern array names the same window, after the static variables
            align = max(16, *(a for _, a in externs))
            start = -(-self.shared_bytes // align) * align
            for name, _ in externs:
                self.shared[name] = start
            self.shared_vars.append((start, start + dynamic_smem, externs[0][0]))
            self.shared_bytes = start + dynamic_smem
        #: pcs of ``try_wait`` spin loops (``L: mbarrier.try_wait p, ...; @!p bra L;``)
        self.spins = {pc for pc, (_, op, ops, _r) in enumerate(self.code)
                      if op.startswith("mbarrier.try_wait") and pc + 1 < len(self.code)
                      and self.code[pc + 1][1].startswith("bra")
                      and self.code[pc + 1][0] == (ops[0], True)
                      and self.labels.get(self.code[pc + 1][2][0]) == pc}

    def shared_var(self, off: int, size: int) -> tuple[int, int, str] | None:
        """The shared variable holding ``[off, off + size)``, or None."""
        for v in self.shared_vars:
            if v[0] <= off and off + size <= v[1]:
                return v
        return None

    def reg_bits(self, name: str) -> int:
        prefix = name.rstrip("0123456789")
        t = self.regtype.get(prefix)
        if t is None:
            raise SimError(f"undeclared register {name}")
        return _BITS[t]


def _f32(bits: np.ndarray) -> np.ndarray:
    return bits.astype(np.uint32).view(np.float32)


def _bits(x: np.ndarray) -> np.ndarray:
    return np.asarray(x, dtype=np.float32).view(np.uint32)


def _bf16_rne(f: np.ndarray) -> np.ndarray:
    b = _bits(f).astype(np.uint64)
    nan = np.isnan(np.asarray(f, dtype=np.float32))
    r = ((b + 0x7FFF + ((b >> 16) & 1)) >> 16) & 0xFFFF
    r = np.where(nan, 0x7FC0, r)
    return r.astype(np.uint16)


def device_bits(x, dtype: str) -> np.ndarray:
    """Host values as the device's 16-bit patterns: bf16 (round to nearest even) or f16."""
    x = np.asarray(x, np.float32)
    return _bf16_rne(x) if dtype == "bf16" else x.astype(np.float16).view(np.uint16)


def host_f64(bits: np.ndarray, dtype: str) -> np.ndarray:
    """Device bit patterns (``"bf16"``, ``"f16"`` or ``"f32"``) as float64 values."""
    if dtype == "bf16":
        return (bits.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    if dtype == "f16":
        return bits.view(np.float16).astype(np.float64)
    return bits.view(np.float32).astype(np.float64)


def _imm(tok: str) -> int | float:
    if tok.startswith("0f"):
        return struct.unpack("<f", struct.pack("<I", int(tok[2:], 16)))[0]
    if tok.startswith("0d"):
        return struct.unpack("<d", struct.pack("<Q", int(tok[2:], 16)))[0]
    return int(tok, 0)


class _Bar:
    """One mbarrier: ``count`` arrivals per phase, ``pending`` of them still to come,
    ``tx`` transaction bytes outstanding, ``phase`` phases completed so far, ``done_at`` the
    simulation step at which the last one completed."""

    def __init__(self, count: int) -> None:
        self.count = count
        self.pending = count
        self.tx = 0
        self.phase = 0
        self.done_at = -1


class _CTA:
    """The threads of one CTA, or of the ``csize`` CTAs of a cluster along x run together:
    thread ``t`` belongs to CTA ``t // block threads``, whose shared window is ``[r * S, (r + 1)
    * S)`` of ``smem`` (``S`` the program's shared bytes); a shared address in an instruction is
    the thread's own CTA's unless ``mapa`` made it a cluster address (``_CLUSTER_TAG``)."""

    def __init__(self, prog: _Prog, mem: _Memory, block, grid, cta, csize: int = 1) -> None:
        self.p = prog
        self.mem = mem
        bx, by, bz = block
        self.per = bx * by * bz
        self.csize = csize
        self.n = self.per * csize
        lin = np.arange(self.n)
        loc = lin % self.per
        self.rank = lin // self.per
        self.special = {
            "%tid.x": loc % bx, "%tid.y": (loc // bx) % by, "%tid.z": loc // (bx * by),
            "%ntid.x": np.full(self.n, bx), "%ntid.y": np.full(self.n, by),
            "%ntid.z": np.full(self.n, bz), "%ctaid.x": cta[0] + self.rank,
            "%ctaid.y": np.full(self.n, cta[1]), "%ctaid.z": np.full(self.n, cta[2]),
            "%nctaid.x": np.full(self.n, grid[0]), "%nctaid.y": np.full(self.n, grid[1]),
            "%nctaid.z": np.full(self.n, grid[2]), "%laneid": loc % 32,
            "%cluster_ctarank": self.rank, "%cluster_nctarank": np.full(self.n, csize),
            "%clusterid.x": np.full(self.n, cta[0] // csize),
            "%smid": np.zeros(self.n, np.int64), "%globaltimer_lo": np.zeros(self.n, np.int64),
        }
        self.lane = lin % 32
        self.warp = lin // 32
        self.regs: dict[str, np.ndarray] = {}
        self.written: dict[str, np.ndarray] = {}
        # each CTA's window starts on a 1024-byte boundary, so swizzles see the same bits
        self.S = -(-max(prog.shared_bytes, 1) // 1024) * 1024
        size = self.S * csize
        self.smem = np.zeros(size, np.uint8)
        self.smem_written = np.zeros(size, bool)
        # async-proxy bookkeeping, per shared byte: the bar.sync count ("epoch") of its last
        # ordinary read and write, the writing thread (-1: none, or a bulk copy) and whether
        # that thread has since run fence.proxy.async; the mbarrier and phase of the bulk
        # copy that filled it (-1: none since the last ordinary write)
        self.epoch = 0
        self.rd_epoch = np.full(size, -1, np.int64)
        #: the simulation step of each byte's last ordinary read; per thread, the step at which
        #: the latest mbarrier phase it saw complete (in a wait) completed: a ring refill may
        #: overwrite bytes read before a phase its issuer waited for (the readers' release)
        self.step = 0
        self.rd_step = np.full(size, -1, np.int64)
        self.wr_step = np.full(size, -1, np.int64)
        self.acq_step = np.full(self.n, -1, np.int64)
        self.wr_epoch = np.full(size, -1, np.int64)
        self.wr_tid = np.full(size, -1, np.int64)
        self.wr_fenced = np.ones(size, bool)
        self.fill_bar = np.full(size, -1, np.int64)
        self.fill_phase = np.zeros(size, np.int64)
        self.bars: dict[int, _Bar] = {}
        #: per mbarrier, per thread: phases the thread has seen complete in a wait
        self.seen: dict[int, np.ndarray] = {}
        self.parked = np.zeros(self.n, bool)
        #: what a parked thread waits for: an mbarrier's address, or -(id + 2) for named barrier id
        self.parked_on = np.full(self.n, -1, np.int64)
        #: per named barrier id: [threads arrived in the open round, their ids]
        self.named: dict[int, list] = {}
        #: per thread: source ranges of bulk stores not yet committed / committed groups
        self.bulk_open: dict[int, list[tuple[int, int]]] = {}
        self.bulk_groups: dict[int, list[list[tuple[int, int]]]] = {}
        #: cp.async, per shared byte: the issuing thread (-1: none since the last ordinary
        #: write), whether its group is still in flight, and the bar.sync epoch it retired in;
        #: per thread: byte indices of copies not yet committed / committed groups
        self.cpa_tid = np.full(size, -1, np.int64)
        self.cpa_flight = np.zeros(size, bool)
        self.cpa_epoch = np.full(size, -1, np.int64)
        self.cpa_open: dict[int, list[np.ndarray]] = {}
        self.cpa_groups: dict[int, list[list[np.ndarray]]] = {}
        #: tcgen05: per CTA, tensor memory (lanes x columns of 32-bit cells), which cells were
        #: written, the allocations (first column -> columns) and whether the CTA gave up its
        #: permit to allocate
        self.tmem = np.zeros((csize, 128, 512), np.uint32)
        self.tmem_written = np.zeros((csize, 128, 512), bool)
        self.tmem_allocs: list[dict[int, int]] = [{} for _ in range(csize)]
        self.tmem_relinquished = np.zeros(csize, bool)

    # -- operands
    def get(self, tok: str, m: np.ndarray) -> np.ndarray:
        """Raw bits (uint of the register width) or a python number for immediates."""
        if tok in self.special:
            return self.special[tok].astype(np.uint32)
        if tok.startswith("%"):
            r = self.regs.get(tok)
            if r is None or not self.written[tok][m].all():
                raise SimError(f"register {tok} read before it was written")
            return r
        if tok in self.p.shared:
            return np.full(self.n, self.p.shared[tok], np.uint32)
        if tok in self.p.tmaps:
            return np.full(self.n, _TMAP_BASE + 256 * self.p.tmaps.index(tok), np.uint64)
        return _imm(tok)

    def as_u(self, tok: str, m, bits: int = 32) -> np.ndarray:
        v = self.get(tok, m)
        if isinstance(v, np.ndarray):
            return v.astype(_NP[bits]) if v.dtype != np.bool_ else v
        return np.full(self.n, int(v) & ((1 << bits) - 1), _NP[bits])

    def as_f(self, tok: str, m) -> np.ndarray:
        v = self.get(tok, m)
        if isinstance(v, np.ndarray):
            return _f32(v)
        return np.full(self.n, v, np.float32)

    def as_p(self, tok: str, m) -> np.ndarray:
        neg = tok.startswith("!")
        v = self.get(tok.lstrip("!"), m)
        if not (isinstance(v, np.ndarray) and v.dtype == np.bool_):
            raise SimError(f"{tok} is not a predicate")
        return ~v if neg else v

    def put(self, tok: str, value: np.ndarray, m: np.ndarray) -> None:
        bits = self.p.reg_bits(tok)
        r = self.regs.get(tok)
        if r is None:
            r = self.regs[tok] = np.zeros(self.n, bool if bits == 0 else _NP[bits])
            self.written[tok] = np.zeros(self.n, bool)
        if bits == 0:
            r[m] = np.asarray(value, bool)[m] if np.ndim(value) else bool(value)
        else:
            v = np.asarray(value)
            if v.dtype == np.float32:
                v = v.view(np.uint32)
            r[m] = (v.astype(np.uint64) & ((1 << bits) - 1)).astype(r.dtype)[m] if np.ndim(v) \
                else int(v) & ((1 << bits) - 1)
        self.written[tok][m] = True

    def putf(self, tok: str, value, m) -> None:
        with np.errstate(all="ignore"):
            self.put(tok, _bits(np.asarray(value, np.float64).astype(np.float32)), m)

    def address(self, tok: str, m) -> np.ndarray:
        inner = tok.strip("[]")
        mm = re.match(r"^([%\w$.]+)(?:\+(-?\d+))?$", inner)
        if not mm:
            raise SimError(f"cannot read address {tok}")
        base = self.get(mm.group(1), m)
        base = base.astype(np.uint64) if isinstance(base, np.ndarray) else np.full(self.n, base, np.uint64)
        return base + np.uint64(int(mm.group(2) or 0) & (2**64 - 1))

    # -- shared addresses of a cluster
    def phys(self, addr: np.ndarray) -> np.ndarray:
        """Physical shared addresses (into ``smem``) of per-thread shared addresses."""
        a = np.asarray(addr).astype(np.int64)
        tagged = (a & _CLUSTER_TAG) != 0
        return np.where(tagged, a & (_CLUSTER_TAG - 1), a + self.rank * self.S)

    def local(self, ph: int) -> int:
        """The CTA-relative offset of physical address ``ph``."""
        return int(ph) % self.S

    def shared_var(self, ph: int, size: int):
        """The shared variable holding physical bytes ``[ph, ph + size)`` (within one CTA)."""
        off = self.local(ph)
        return self.p.shared_var(off, size) if off + size <= self.S else None

    # -- mbarriers and the async proxy
    def shared_name(self, off: int) -> str:
        v = self.shared_var(off, 1)
        cta = f" (CTA {int(off) // self.S} of the cluster)" if self.csize > 1 else ""
        return (f"{v[2]}+{self.local(off) - v[0]}" if v else f"shared {off:#x}") + cta

    def bar_addrs(self, tok: str, m: np.ndarray) -> np.ndarray:
        addr = self.phys(self.address(tok, m))
        for a in np.unique(addr[m]).tolist():
            if a % 8 or self.shared_var(a, 8) is None:
                raise SimError(f"mbarrier address {a:#x} is not an 8-byte aligned slot of a "
                               "shared variable")
        return addr

    def barrier(self, addr: int) -> _Bar:
        b = self.bars.get(addr)
        if b is None:
            raise SimError(f"mbarrier {self.shared_name(addr)} used before mbarrier.init")
        return b

    def settle(self, addr: int) -> None:
        """Complete the barrier's phase if its arrivals and bytes are all in; wake waiters."""
        b = self.bars[addr]
        if b.pending < 0:
            raise SimError(f"mbarrier {self.shared_name(addr)}: more arrivals than its count "
                           f"{b.count} in phase {b.phase}")
        if b.pending == 0 and b.tx == 0:
            b.phase += 1
            b.pending = b.count
            b.done_at = self.step
            woken = self.parked & (self.parked_on >= 0)
            self.parked[woken] = False
            self.parked_on[woken] = -1

    def deadlock(self) -> str:
        out = []
        for a in np.unique(self.parked_on[self.parked]).tolist():
            if a <= -2:
                n, _ = self.named[-a - 2]
                out.append(f"{int((self.parked_on == a).sum())} on named barrier {-a - 2} "
                           f"({n} threads arrived)")
                continue
            b = self.bars[a]
            out.append(f"{int((self.parked_on[self.parked] == a).sum())} on {self.shared_name(a)} (phase "
                       f"{b.phase} open: {b.pending} of {b.count} arrivals outstanding, tx count "
                       f"{b.tx})")
        return "; ".join(out)

    def check_filled(self, idx: np.ndarray, tids: np.ndarray, what: str) -> None:
        """Threads ``tids`` touch shared bytes ``idx`` (one row per thread): any byte a bulk
        copy filled needs a wait by that thread that saw the copy's phase complete."""
        fb = self.fill_bar[idx]
        hit = fb >= 0
        if not hit.any():
            return
        rows = np.broadcast_to(np.asarray(tids)[:, None], idx.shape)
        ph = self.fill_phase[idx]
        for a in np.unique(fb[hit]).tolist():
            sel = fb == a
            seen = self.seen.get(a)
            seen = seen[rows[sel]] if seen is not None else np.zeros(int(sel.sum()), np.int64)
            if (seen <= ph[sel]).any():
                k = int(np.argmax(seen <= ph[sel]))
                raise SimError(f"{what} shared bytes a bulk copy fills (completing phase "
                               f"{int(ph[sel][k])} of mbarrier {self.shared_name(a)}) before "
                               f"thread {int(rows[sel][k])} waited for that phase")

    def check_store_sources(self, idx: np.ndarray, what: str) -> None:
        """``idx`` is about to be overwritten: no bulk store may still be reading it."""
        for t in set(self.bulk_open) | set(self.bulk_groups):
            ranges = list(self.bulk_open.get(t, []))
            for g in self.bulk_groups.get(t, []):
                ranges += g
            for lo, hi in ranges:
                if ((idx >= lo) & (idx < hi)).any():
                    raise SimError(f"{what} {self.shared_name(lo)}.. while thread {t}'s bulk "
                                   "store may still read it (no cp.async.bulk.wait_group.read "
                                   "retired that group)")

    def track_shared(self, write: bool, idx: np.ndarray, tids: np.ndarray) -> None:
        """An ordinary ``ld``/``st.shared`` of bytes ``idx`` (one row per thread of ``tids``)."""
        self.check_filled(idx, tids, "overwrites" if write else "reads")
        self.check_cp_async(idx, tids, "overwrites" if write else "reads")
        if not write:
            self.rd_epoch[idx] = self.epoch
            self.rd_step[idx] = self.step
            return
        self.check_store_sources(idx, "overwrites")
        self.wr_epoch[idx] = self.epoch
        self.wr_step[idx] = self.step
        self.wr_tid[idx] = tids[:, None]
        self.wr_fenced[idx] = False
        self.fill_bar[idx] = -1

    def check_cp_async(self, idx: np.ndarray, tids: np.ndarray, what: str) -> None:
        """Threads ``tids`` touch bytes ``idx`` (one row per thread): a byte a ``cp.async``
        filled must be retired by its issuer's wait, and for other threads a ``bar.sync``
        must follow that wait; an ordinary write then clears the byte's copy record."""
        ct = self.cpa_tid[idx]
        hit = ct >= 0
        if hit.any():
            rows = np.broadcast_to(np.asarray(tids)[:, None], idx.shape)
            if (hit & self.cpa_flight[idx]).any():
                raise SimError(f"{what} shared bytes a cp.async is still filling (no "
                               "cp.async.wait_group of its thread retired the group)")
            other = hit & (ct != rows) & (self.cpa_epoch[idx] == self.epoch)
            if other.any():
                k = np.argwhere(other)[0]
                raise SimError(f"{what} shared bytes thread {int(ct[tuple(k)])}'s cp.async "
                               f"filled; thread {int(rows[tuple(k)])} needs a bar.sync after "
                               "that thread's cp.async.wait_group")
        if what == "overwrites":
            self.cpa_tid[idx] = -1

    def cp_async(self, dst: int, src: int, size: int, n: int, t: int) -> None:
        """Thread ``t``'s ``cp.async`` of ``n`` of ``size`` bytes (the rest zeros) from global
        ``src`` to shared ``dst``, run at issue and in flight until its group retires."""
        if dst % size:
            raise SimError(f"cp.async shared address {dst:#x} is not {size}-byte aligned")
        if self.shared_var(dst, size) is None:
            raise SimError(f"cp.async of {size} bytes at shared {dst:#x} runs outside its "
                           "shared variable")
        if not 0 <= n <= size:
            raise SimError(f"cp.async src_size {n} outside 0..{size}")
        data = np.zeros(size, np.uint8)
        if n:
            i, off = self.mem.locate(np.array([src], np.uint64), size, "cp.async global address")
            off = int(off[0])
            if off + n > len(self.mem.bufs[i]):
                raise SimError(f"cp.async global address: out of bounds of buffer {i}")
            data[:n] = self.mem.bufs[i][off:off + n]
        r = np.arange(dst, dst + size)
        read = self.rd_epoch[r] == self.epoch
        if read.any() or self.unordered_writes(r, t).any() or \
                ((self.cpa_tid[r] >= 0) & (self.cpa_tid[r] != t)
                 & (self.cpa_epoch[r] == self.epoch)).any():
            raise SimError(f"cp.async overwrites {self.shared_name(dst)}.. which threads "
                           "accessed since the last bar.sync (they may not be done with it)")
        self.check_filled(r[None, :], np.array([t]), "cp.async overwrites")
        self.check_store_sources(r, "cp.async overwrites")
        self.smem[r] = data
        self.smem_written[r] = True
        self.wr_tid[r] = -1
        self.fill_bar[r] = -1
        self.cpa_tid[r] = t
        self.cpa_flight[r] = True
        self.cpa_open.setdefault(t, []).append(r)

    def unordered_writes(self, r: np.ndarray, t: int) -> np.ndarray:
        """Bytes of ``r`` another thread wrote with no bar.sync since and no mbarrier phase
        that thread ``t`` waited for completing after the write."""
        wt = self.wr_tid[r]
        return ((wt >= 0) & (wt != t) & (self.wr_epoch[r] == self.epoch)
                & (self.wr_step[r] >= self.acq_step[t]))

    def check_refill(self, r: np.ndarray, t: int, what: str, dst: int) -> None:
        """A copy issued by thread ``t`` is about to fill bytes ``r``: no thread may have read
        them since the last bar.sync unless ``t`` then waited for an mbarrier phase that
        completed after the read, and no other thread may have written them since."""
        read = (self.rd_epoch[r] == self.epoch) & (self.rd_step[r] >= self.acq_step[t])
        if read.any() or self.unordered_writes(r, t).any():
            raise SimError(f"{what} overwrites {self.shared_name(dst)}.. which threads accessed "
                           "since the last bar.sync or mbarrier wait (they may not be done with it)")

    def bulk_ranges(self, what: str, shared: int, glob: int, n: int) -> tuple[int, int]:
        """Check a bulk copy's ``n`` bytes at shared ``shared`` and global ``glob`` (16-byte
        aligned, a positive multiple of 16, inside one shared variable and one buffer);
        returns (buffer index, byte offset) of the global side."""
        if n <= 0 or n % 16 or shared % 16:
            raise SimError(f"{what} of {n} bytes at shared {shared:#x}: needs a 16-byte aligned "
                           "shared address and a positive multiple of 16 bytes")
        if self.shared_var(shared, n) is None:
            raise SimError(f"{what} of {n} bytes at shared {shared:#x} runs outside its shared "
                           "variable")
        i, off = self.mem.locate(np.array([glob], np.uint64), 16, f"{what} global address")
        off = int(off[0])
        if off + n > len(self.mem.bufs[i]):
            raise SimError(f"{what} global address: out of bounds of buffer {i} (size "
                           f"{len(self.mem.bufs[i])} B) at offset {off}, {n} bytes")
        return i, off

    def bulk_load(self, dst: int, src: int, n: int, bar: int, t: int) -> None:
        """``cp.async.bulk`` global -> shared, run at issue; completes ``n`` bytes on ``bar``."""
        b = self.barrier(bar)
        i, off = self.bulk_ranges("bulk copy", dst, src, n)
        r = np.arange(dst, dst + n)
        self.check_store_sources(r, "bulk copy overwrites")
        self.check_refill(r, t, "bulk copy", dst)
        self.smem[dst:dst + n] = self.mem.bufs[i][off:off + n]
        self.landed(r, b, bar)

    def landed(self, r: np.ndarray, b: _Bar, bar: int) -> None:
        """A copy's bytes ``r`` are in shared memory: they complete on mbarrier ``b`` (at
        ``bar``), and a reader must wait for that phase."""
        self.smem_written[r] = True
        self.wr_tid[r] = -1
        self.wr_fenced[r] = True
        self.fill_bar[r] = bar
        self.fill_phase[r] = b.phase
        b.tx -= r.size
        self.settle(bar)

    def check_store_source(self, r: np.ndarray, t: int, what: str, src: int) -> None:
        """A store thread ``t`` issues reads shared bytes ``r``: written, the copies that
        filled them waited for, st.shared writes fenced, other threads' writes ordered."""
        if not self.smem_written[r].all():
            raise SimError(f"{what} reads shared memory nothing wrote")
        self.check_filled(r[None, :], np.array([t]), f"{what} reads")
        wt = self.wr_tid[r]
        if ((wt >= 0) & ~self.wr_fenced[r]).any():
            raise SimError(f"{what} reads {self.shared_name(src)}.. written by st.shared "
                           "with no fence.proxy.async by the writer since")
        if self.unordered_writes(r, t).any():
            raise SimError(f"{what} reads {self.shared_name(src)}.. which other threads "
                           "wrote since the last bar.sync or mbarrier wait")

    def bulk_store(self, dst: int, src: int, n: int, t: int) -> None:
        """``cp.async.bulk`` shared -> global (bulk group), run at issue."""
        i, off = self.bulk_ranges("bulk store", src, dst, n)
        r = np.arange(src, src + n)
        self.check_store_source(r, t, "bulk store", src)
        self.mem.bufs[i][off:off + n] = self.smem[src:src + n]
        self.mem.written[i][off:off + n] = True
        self.bulk_open.setdefault(t, []).append((src, src + n))


def _tmap(c: _CTA, tok: str, m: np.ndarray, t: int):
    """``(TmaParams, buffer index)`` of the tensor map whose address thread ``t`` holds."""
    a = int(c.as_u(tok, m, 64)[t]) - _TMAP_BASE
    k = a // 256
    if a < 0 or a % 256 or k >= len(c.mem.tmaps):
        raise SimError(f"{tok} does not hold a tensor map parameter's address")
    return c.mem.tmaps[k]


def _coords(c: _CTA, text: str, m: np.ndarray, t: int) -> list[int]:
    out = []
    for tok in text.strip("{}").split(","):
        v = c.as_u(tok.strip(), m, 32)[t]
        out.append(int(np.int64(v) - (1 << 32) if v >= 1 << 31 else v))
    return out


def _tile_smem(c: _CTA, params, start: int, e: int, n_elems: int, what: str) -> np.ndarray:
    """Shared byte addresses (one row per element) of a box of ``n_elems`` placed at ``start``."""
    width = _SWIZZLE_WIDTH[params.swizzle.value]
    n = n_elems * e
    if width is not None and params.box_dims[0] * e != width:
        raise SimError(f"{what}: a {width}-byte swizzle with a {params.box_dims[0] * e}-byte "
                       "inner box is not modelled")
    if c.local(start) % (8 * width if width else 128):
        raise SimError(f"{what}: shared address {start:#x} is not aligned to the box's "
                       f"{8 * width if width else 128}-byte swizzle period")
    if c.shared_var(start, n) is None:
        raise SimError(f"{what} of {n} bytes at shared {start:#x} runs outside its shared variable")
    lin = start + np.arange(n, dtype=np.int64)
    return _swizzle(lin, width).reshape(n_elems, e)


def _tma_load(c: _CTA, dst: int, params, buf: int, coords: list[int], bar: int, t: int) -> None:
    """``cp.async.bulk.tensor`` global -> shared at issue: the box (zeros outside the tensor)
    written swizzled; its bytes complete on ``bar``."""
    b = c.barrier(bar)
    e, off, inside = _box(params, coords)
    sa = _tile_smem(c, params, dst, e, off.size, "tile copy")
    r = sa.reshape(-1)
    c.check_store_sources(r, "tile copy overwrites")
    c.check_refill(r, t, "tile copy", dst)
    data = np.zeros((off.size, e), np.uint8)
    g = off[inside][:, None] + np.arange(e)[None, :]
    data[inside] = c.mem.bufs[buf][g]
    c.smem[sa] = data
    c.landed(r, b, bar)


def _tma_store(c: _CTA, params, buf: int, coords: list[int], src: int, t: int, op: str) -> None:
    """``cp.async.bulk.tensor`` (or ``cp.reduce``) shared -> global at issue, clipped at the
    tensor's edges, with the bulk store's checks on the shared side."""
    e, off, inside = _box(params, coords)
    sa = _tile_smem(c, params, src, e, off.size, "tile store")
    r = sa.reshape(-1)
    c.check_store_source(r, t, "tile store", src)
    g = off[inside][:, None] + np.arange(e)[None, :]
    vals = c.smem[sa[inside]]
    if op == "store":
        c.mem.bufs[buf][g] = vals
    elif op == "add" and e == 4:
        old = c.mem.bufs[buf][g].copy().view(np.float32)
        c.mem.bufs[buf][g] = (old + vals.copy().view(np.float32)).view(np.uint8)
    else:
        raise SimError(f"unsupported tile reduction {op} on {e}-byte elements")
    c.mem.written[buf][g] = True
    lo = int(r.min())
    c.bulk_open.setdefault(t, []).append((lo, int(r.max()) + 1))


def _operand(c: _CTA, desc: int, rows: int, k: int, t: str, trans: int,
             window: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """A wgmma operand read through a matrix descriptor: ``(rows x k)`` float64 values (row =
    M for A, N for B) and the shared byte addresses read. Canonical layouts (bytes; ``w`` the
    swizzle width, 16 without one): K-major ``(r // 8) * SBO + (r % 8) * w + k * e`` (without
    a swizzle ``+ (k * e // 16) * LBO`` picks the K core matrix), MN-major
    ``(r * e // w) * LBO + (k // 8) * SBO + (k % 8) * w + r * e % w`` (without a swizzle LBO
    and SBO trade places); then the swizzle of the address."""
    start = (desc & 0x3FFF) << 4
    lbo = ((desc >> 16) & 0x3FFF) << 4
    sbo = ((desc >> 32) & 0x3FFF) << 4
    if (desc >> 49) & 7:
        raise SimError("wgmma descriptor base offset != 0 is not modelled")
    width = _DESC_WIDTH[desc >> 62]
    w = width or 16
    e = _ELEM[t]
    r = np.arange(rows, dtype=np.int64)[:, None]
    kk = np.arange(k, dtype=np.int64)[None, :]
    if not trans:
        kb = kk * e
        if width is None:
            off = (r // 8) * sbo + (r % 8) * 16 + (kb // 16) * lbo + kb % 16
        else:
            off = (r // 8) * sbo + (r % 8) * w + kb
    else:
        rb = r * e
        if width is None:
            off = (rb // 16) * sbo + (kk // 8) * lbo + (kk % 8) * 16 + rb % 16
        else:
            off = (rb // w) * lbo + (kk // 8) * sbo + (kk % 8) * w + rb % w
    addr = _swizzle(start + off, width)
    byte = addr[..., None] + np.arange(e)[None, None, :]
    if (byte < 0).any() or (byte >= c.S).any():
        raise SimError("wgmma operand reads outside shared memory")
    byte = byte + window
    if not c.smem_written[byte].all():
        raise SimError("wgmma reads shared memory nothing wrote")
    raw = c.smem[byte].copy()
    bits = {1: np.uint8, 2: np.uint16, 4: np.uint32}[e]
    vals = raw.reshape(-1, e).view(bits).reshape(rows, k)
    return _to_float(vals, t), byte.reshape(-1)


def _frag(nregs: int) -> tuple[np.ndarray, np.ndarray]:
    """(row, col) of accumulator register i of warpgroup thread t: arrays [t, i]."""
    t = np.arange(128)[:, None]
    i = np.arange(nregs)[None, :]
    w, lane = t // 32, t % 32
    row = 16 * w + lane // 4 + 8 * ((i % 4) // 2)
    col = 8 * (i // 4) + 2 * (lane % 4) + i % 2
    return row, col


def _wgmma(c: _CTA, op: str, ops: list[str], m: np.ndarray) -> None:
    """``wgmma.mma_async`` for each warpgroup of the active threads, computed at issue."""
    parts = op.split(".")
    shape, td, ta, tb = parts[4], parts[5], parts[6], parts[7]
    n = int(shape[shape.index("n") + 1:shape.index("k")])
    k = int(shape[shape.index("k") + 1:])
    if not shape.startswith("m64") or td != "f32":
        raise SimError(f"unsupported {op} (f32 accumulators of m64 shapes only)")
    d = [x.strip() for x in ops[0].strip("{}").split(",")]
    a_regs = ops[1].startswith("{")
    rest = ops[3:]
    # the transpose immediates exist for 16-bit types only (others are K-major)
    trans_a = int(_imm(rest[3])) if not a_regs and len(rest) > 4 else 0
    trans_b = int(_imm(rest[-1])) if len(rest) > (3 if a_regs else 4) else 0
    neg_a, neg_b = int(_imm(rest[1])) == -1, int(_imm(rest[2])) == -1
    row, col = _frag(len(d))
    for g in np.unique(np.nonzero(m)[0] // 128).tolist():
        ths = np.arange(g * 128, g * 128 + 128)
        if not m[ths].all():
            raise SimError(f"{op}: warpgroup {g} has {int(m[ths].sum())} of 128 threads here")
        readers = ths[::32]
        if rest[0].startswith(("%", "!")):
            sd = c.as_p(rest[0], m)[ths]
            if sd.min() != sd.max():
                raise SimError(f"{op}: scale-d differs within warpgroup {g}")
            scale_d = bool(sd[0])
        else:
            scale_d = bool(int(_imm(rest[0])))
        bdesc = c.as_u(ops[2], m, 64)[ths]
        if (bdesc != bdesc[0]).any():
            raise SimError(f"{op}: B descriptor differs within warpgroup {g}")
        window = int(c.rank[ths[0]]) * c.S
        bv, bbytes = _operand(c, int(bdesc[0]), n, k, tb, trans_b, window)
        c.check_filled(np.broadcast_to(bbytes, (len(readers), bbytes.size)), readers, "wgmma reads")
        if a_regs:
            if ta not in ("bf16", "f16"):
                raise SimError(f"unsupported {op}: register A of .{ta}")
            regs = [x.strip() for x in ops[1].strip("{}").split(",")]
            av = np.zeros((64, k))
            tl = np.arange(128)
            lane, w = tl % 32, tl // 32
            for j, tok in enumerate(regs):
                v = c.as_u(tok, m, 32)[ths]
                r0 = 16 * w + lane // 4 + 8 * (j % 2)
                k0 = 2 * (lane % 4) + 8 * (j // 2)
                av[r0, k0] = _to_float(v & 0xFFFF, ta)
                av[r0, k0 + 1] = _to_float(v >> 16, ta)
        else:
            adesc = c.as_u(ops[1], m, 64)[ths]
            if (adesc != adesc[0]).any():
                raise SimError(f"{op}: A descriptor differs within warpgroup {g}")
            av, abytes = _operand(c, int(adesc[0]), 64, k, ta, trans_a, window)
            c.check_filled(np.broadcast_to(abytes, (len(readers), abytes.size)), readers,
                           "wgmma reads")
        prod = (-av if neg_a else av) @ (-bv if neg_b else bv).T        # (64, n)
        acc = np.zeros((128, len(d)))
        if scale_d:
            for i, tok in enumerate(d):
                acc[:, i] = c.as_f(tok, m)[ths]
        acc += prod[row, col]
        mm = np.zeros(c.n, bool)
        mm[ths] = True
        for i, tok in enumerate(d):
            full = np.zeros(c.n)
            full[ths] = acc[:, i]
            c.putf(tok, full, mm)


# ---------------------------------------------------------------------- tcgen05 (Blackwell)
_UMMA_AB = {"f16": {0: "f16", 1: "bf16"}, "tf32": {2: "tf32"}, "f8f6f4": {0: "e4m3", 1: "e5m2"}}


def _warps_whole(c: _CTA, m: np.ndarray, op: str) -> list[int]:
    """The warps with active threads here, each of which must be whole (``.sync.aligned``)."""
    warps = np.unique(c.warp[m]).tolist()
    for w in warps:
        if not m[w * 32:(w + 1) * 32].all():
            raise SimError(f"{op}: warp {w} has {int(m[w * 32:(w + 1) * 32].sum())} of 32 "
                           "threads here")
    return warps


def _tmem_cells(c: _CTA, r: int, lane: np.ndarray, col: np.ndarray, what: str) -> None:
    """Lanes/columns a tcgen05 access of CTA ``r`` touches lie in its allocated columns."""
    if (lane < 0).any() or (lane >= 128).any():
        raise SimError(f"{what}: tensor memory lane outside 0..127")
    cols = np.unique(col).tolist()
    owned = np.zeros(512, bool)
    for first, n in c.tmem_allocs[r].items():
        owned[first:first + n] = True
    bad = [x for x in cols if not 0 <= x < 512 or not owned[x]]
    if bad:
        raise SimError(f"{what}: tensor memory column {bad[0]} of CTA {r} is not allocated "
                       f"(allocations {sorted(c.tmem_allocs[r].items())})")


def _umma_operand(c: _CTA, desc: int, rows: int, k: int, t: str, trans: int, r: int,
                  what: str) -> tuple[np.ndarray, np.ndarray]:
    if (desc >> 46) & 7 != 1:
        raise SimError(f"{what}: shared-memory descriptor version (bits 46-48) is "
                       f"{(desc >> 46) & 7}, tcgen05 needs 1 (a wgmma descriptor? use "
                       "OperandTile.descriptor(..., target='tcgen05'))")
    if (desc >> 52) & 1 or (desc >> 61) & 1:
        raise SimError(f"{what}: LBO mode / 128B-base-32B swizzle are not modelled")
    return _operand(c, desc & ~(7 << 46), rows, k, t, trans, r * c.S)


def _tcgen05_mma(c: _CTA, op: str, ops: list[str], m: np.ndarray, tids: np.ndarray) -> None:
    parts = op.split(".")
    group = int(parts[2].split("::")[1])
    kind = parts[3].split("::")[1]
    if len(ops) != 5 or not ops[1].startswith("%"):
        raise SimError(f"unsupported {op} form (A from tensor memory or lane masks)")
    for r in np.unique(c.rank[m]).tolist():
        if int((c.rank[m] == r).sum()) != 1:
            raise SimError(f"{op}: {int((c.rank[m] == r).sum())} threads of CTA {r} issue it "
                           "(one thread issues an mma for the CTA)")
    for t in tids.tolist():
        r = int(c.rank[t])
        one = np.zeros(c.n, bool)
        one[t] = True
        idesc = int(c.as_u(ops[3], one, 32)[t]) if ops[3].startswith("%") else int(_imm(ops[3]))
        if idesc & 0b1111 or (idesc >> 30):
            raise SimError(f"{op}: sparse, saturating or shifted descriptors are not modelled")
        if (idesc >> 4) & 3 != 1:
            raise SimError(f"{op}: only f32 accumulators are modelled (D format "
                           f"{(idesc >> 4) & 3})")
        fmts = _UMMA_AB[kind]
        fa, fb = (idesc >> 7) & 7, (idesc >> 10) & 7
        if fa not in fmts or fb not in fmts:
            raise SimError(f"{op}: A/B formats {fa}/{fb} are not modelled for kind::{kind}")
        ta, tb = fmts[fa], fmts[fb]
        neg_a, neg_b = (idesc >> 13) & 1, (idesc >> 14) & 1
        tr_a, tr_b = (idesc >> 15) & 1, (idesc >> 16) & 1
        n, mm = ((idesc >> 17) & 0x3F) << 3, ((idesc >> 24) & 0x1F) << 4
        if (group, mm) not in ((1, 128), (2, 256)):
            raise SimError(f"{op}: M={mm} with cta_group::{group} is not modelled (M 128 with "
                           "cta_group::1, 256 with cta_group::2)")
        k = 32 // _ELEM[ta]
        d = int(c.as_u(ops[0].strip("[]"), one, 32)[t])
        lane0, col0 = d >> 16, d & 0xFFFF
        if lane0:
            raise SimError(f"{op}: D must start at lane 0, got lane {lane0}")
        en = ops[4]
        acc_in = bool(c.as_p(en, one)[t]) if en.startswith(("%", "!")) else bool(int(_imm(en)))
        ctas = [r] if group == 1 else [r, r + 1]
        if group == 2 and (r % 2 or r + 1 >= c.csize):
            raise SimError(f"{op}: cta_group::2 is issued by the even CTA of a pair; CTA {r} "
                           f"of a cluster of {c.csize}")
        adesc = int(c.as_u(ops[1], one, 64)[t])
        bdesc = int(c.as_u(ops[2], one, 64)[t])
        nb = n // len(ctas)
        bvals = []
        for q in ctas:
            bv, bb = _umma_operand(c, bdesc, nb, k, tb, tr_b, q, op)
            if q == r:
                c.check_filled(bb[None, :], np.array([t]), "tcgen05.mma reads")
            bvals.append(bv)
        bv = np.concatenate(bvals)
        for q in ctas:
            av, ab = _umma_operand(c, adesc, 128, k, ta, tr_a, q, op)
            if q == r:
                c.check_filled(ab[None, :], np.array([t]), "tcgen05.mma reads")
            prod = (-av if neg_a else av) @ (-bv if neg_b else bv).T       # (128, n)
            lanes = np.arange(128)[:, None]
            cols = col0 + np.arange(n)[None, :]
            _tmem_cells(c, q, lanes, cols, op)
            if acc_in:
                if not c.tmem_written[q][lanes, cols].all():
                    raise SimError(f"{op}: accumulates into tensor memory nothing wrote "
                                   "(enable_input_d on the first k-step?)")
                prod = prod + c.tmem[q][lanes, cols].view(np.float32).astype(np.float64)
            c.tmem[q][lanes, cols] = prod.astype(np.float32).view(np.uint32)
            c.tmem_written[q][lanes, cols] = True


def _tcgen05(c: _CTA, op: str, ops: list[str], m: np.ndarray, tids: np.ndarray) -> None:
    """Blackwell tensor-memory instructions (see the module docstring)."""
    kind = op.split(".")[1].split("::")[0]
    if kind in ("fence", "wait"):
        return
    if kind == "mma":
        _tcgen05_mma(c, op, ops, m, tids)
        return
    if kind == "commit":
        addr = c.bar_addrs(ops[0], m)
        mask = c.as_u(ops[1], m, 16) if "multicast" in op else None
        for t in tids.tolist():
            a = int(addr[t])
            targets = [a]
            if mask is not None:
                local = c.local(a)
                targets = [q * c.S + local for q in range(c.csize) if int(mask[t]) >> q & 1]
            for b in targets:
                c.barrier(b).pending -= 1
                c.settle(b)
        return
    if kind == "relinquish_alloc_permit":
        for w in _warps_whole(c, m, op):
            c.tmem_relinquished[int(c.rank[w * 32])] = True
        return
    if kind in ("alloc", "dealloc"):
        for w in _warps_whole(c, m, op):
            t = w * 32
            r = int(c.rank[t])
            one = np.zeros(c.n, bool)
            one[t] = True
            ncols = int(_imm(ops[1])) if not ops[1].startswith("%") else int(c.as_u(ops[1], one)[t])
            allocs = c.tmem_allocs[r]
            if kind == "dealloc":
                col = int(c.as_u(ops[0], one)[t]) & 0xFFFF
                if allocs.get(col) != ncols:
                    raise SimError(f"{op}: columns {col}..+{ncols} of CTA {r} are not one "
                                   f"allocation (allocations {sorted(allocs.items())})")
                del allocs[col]
                continue
            if c.tmem_relinquished[r]:
                raise SimError(f"{op}: CTA {r} allocates after relinquish_alloc_permit")
            used = np.zeros(512, bool)
            for first, n in allocs.items():
                used[first:first + n] = True
            free = [x for x in range(0, 512, ncols) if not used[x:x + ncols].any()]
            if not free:
                raise SimError(f"{op}: CTA {r} has no {ncols} free columns (allocations "
                               f"{sorted(allocs.items())}); a real GPU would block")
            allocs[free[0]] = ncols
            slot = int(c.phys(c.address(ops[0], one))[t])
            idx = np.arange(slot, slot + 4)[None, :]
            c.track_shared(True, idx, np.array([t]))
            c.smem[slot:slot + 4] = np.array([free[0]], np.uint32).view(np.uint8)
            c.smem_written[slot:slot + 4] = True
        return
    if kind in ("ld", "st"):
        parts = op.split(".")
        shape, num = parts[4], parts[5]
        if shape != "32x32b" or len(parts) != 7:
            raise SimError(f"unsupported {op} (32x32b without pack/unpack only)")
        n = int(num[1:])
        regs_tok, addr_tok = (ops[0], ops[1]) if kind == "ld" else (ops[1], ops[0])
        regs = [x.strip() for x in regs_tok.strip("{}").split(",")]
        taddr = c.as_u(addr_tok.strip("[]"), m, 32).astype(np.int64)
        for w in _warps_whole(c, m, op):
            ths = np.arange(w * 32, w * 32 + 32)
            r = int(c.rank[ths[0]])
            a = taddr[ths]
            if (a != a[0]).any():
                raise SimError(f"{op}: the tensor memory address differs within warp {w}")
            lane0, col0 = int(a[0]) >> 16, int(a[0]) & 0xFFFF
            quarter = 32 * ((w % (c.per // 32)) % 4)
            if lane0 != quarter:
                raise SimError(f"{op}: warp {w} reaches lanes {quarter}..{quarter + 31}, got "
                               f"lane {lane0}")
            lanes = (lane0 + np.arange(32))[:, None]
            cols = (col0 + np.arange(n))[None, :]
            _tmem_cells(c, r, lanes, cols, op)
            wm = np.zeros(c.n, bool)
            wm[ths] = True
            if kind == "ld":
                if not c.tmem_written[r][lanes, cols].all():
                    raise SimError(f"{op}: reads tensor memory nothing wrote")
                vals = c.tmem[r][lanes, cols]
                for j, tok in enumerate(regs):
                    full = np.zeros(c.n, np.uint32)
                    full[ths] = vals[:, j]
                    c.put(tok, full, wm)
            else:
                for j, tok in enumerate(regs):
                    c.tmem[r][lanes[:, 0], col0 + j] = c.as_u(tok, wm, 32)[ths]
                c.tmem_written[r][lanes, cols] = True
        return
    raise SimError(f"unsupported {op}")


def _matrix_quads(c: _CTA, op: str, regs_op: str, addr_op: str, m: np.ndarray):
    """The 8x8 matrices of an ``ldmatrix``/``stmatrix``: for each warp and matrix ``i``
    (lanes ``8i..8i+7`` give its row addresses), ``(lanes, register token, byte indices)``:
    the indices of the element pairs that register ``i`` of lane ``l`` holds, ``(l // 4,
    2 (l % 4) + {0, 1})`` (``.trans``: rows ``2 (l % 4) + {0, 1}``, column ``l // 4``), as a
    ``(64, 2)`` array: the 32 low halves' bytes, then the 32 high halves'."""
    num = int(op.split(".x")[1].split(".")[0])
    regs = [x.strip() for x in regs_op.strip("{}").split(",")]
    addr = c.phys(c.address(addr_op, m))
    lr, lc = np.arange(32) // 4, 2 * (np.arange(32) % 4)
    for wp in np.unique(c.warp[m]).tolist():
        lanes = np.arange(wp * 32, wp * 32 + 32)
        if not m[lanes].all():
            raise SimError(f"{op}: warp {wp} has {int(m[lanes].sum())} of 32 lanes here")
        for i, tok in enumerate(regs[:num]):
            rows = addr[lanes[8 * i:8 * i + 8]]
            if (rows % 16).any():
                raise SimError(f"{op}: row addresses must be 16-byte aligned")
            if ".trans" in op:
                pos = np.concatenate([rows[lc] + 2 * lr, rows[lc + 1] + 2 * lr])
            else:
                pos = np.concatenate([rows[lr] + 2 * lc, rows[lr] + 2 * lc + 2])
            idx = pos[:, None] + np.arange(2)[None, :]
            if (idx < 0).any() or (idx >= c.S * c.csize).any():
                raise SimError(f"{op}: shared access out of bounds")
            yield lanes, tok, idx


def _stmatrix(c: _CTA, op: str, ops: list[str], m: np.ndarray) -> None:
    """``stmatrix.sync.aligned.m8n8.x{1,2,4}{.trans}.shared.b16`` (layout: ``_matrix_quads``)."""
    for lanes, tok, idx in _matrix_quads(c, op, ops[1], ops[0], m):
        v = c.as_u(tok, m, 32)[lanes]
        val = np.concatenate([(v & 0xFFFF).astype(np.uint16), (v >> 16).astype(np.uint16)])
        c.track_shared(True, idx, np.concatenate([lanes, lanes]))
        c.smem[idx] = val.view(np.uint8).reshape(-1, 2)
        c.smem_written[idx] = True


def _ldmatrix(c: _CTA, op: str, ops: list[str], m: np.ndarray) -> None:
    """``ldmatrix.sync.aligned.m8n8.x{1,2,4}{.trans}.shared.b16``, the mirror of ``stmatrix``."""
    for lanes, tok, idx in _matrix_quads(c, op, ops[0], ops[1], m):
        if not c.smem_written[idx].all():
            raise SimError(f"{op}: reads shared memory nothing wrote")
        c.track_shared(False, idx, np.concatenate([lanes, lanes]))
        half = c.smem[idx].copy().reshape(-1).view(np.uint16).astype(np.uint32)
        full = np.zeros(c.n, np.uint32)
        full[lanes] = half[:32] | (half[32:] << np.uint32(16))
        mm = np.zeros(c.n, bool)
        mm[lanes] = True
        c.put(tok, full, mm)


def _mma_fragments(shape: str):
    """The ``mma.sync`` fragment layout of ``shape`` (m16n8k8 / m16n8k16, 16-bit inputs):
    for A, B and C/D, per register and half (low first), the ``(row, col)`` of each lane's
    element as two ``(32,)`` arrays; B's rows are k, its columns n."""
    lane = np.arange(32)
    g, t2 = lane // 4, 2 * (lane % 4)
    ka = int(shape.split("k")[1]) // 8
    a = [(g + 8 * (i % 2), t2 + 8 * (i // 2) + h) for i in range(2 * ka) for h in (0, 1)]
    b = [(t2 + 8 * i + h, g) for i in range(ka) for h in (0, 1)]
    cd = [(g + 8 * i, t2 + h) for i in range(2) for h in (0, 1)]
    return a, b, cd


def _mma_sync(c: _CTA, op: str, ops: list[str], m: np.ndarray) -> None:
    """``mma.sync.aligned.m16n8k{8,16}.row.col.{d}.{a}.{b}.{c}`` (bf16/f16 inputs, f32 or f16
    C/D) for each warp of the active threads, computed at issue."""
    parts = op.split(".")
    shape, lay = parts[3], parts[4:6]
    td, ta, tb, tc = parts[-4:]
    if shape not in ("m16n8k8", "m16n8k16") or lay != ["row", "col"] or ta != tb \
            or ta not in ("bf16", "f16") or {td, tc} - {"f32", "f16"}:
        raise SimError(f"unsupported {op}")
    fa, fb, fcd = _mma_fragments(shape)
    k = int(shape.split("k")[1])
    regs = [[x.strip() for x in o.strip("{}").split(",")] for o in ops]

    def halves(tok, wide):          # 16-bit inputs: two per register, low first
        v = c.as_u(tok, m, 32)
        return [v & 0xFFFF, v >> 16] if not wide else [v]

    def gather(toks, frag, shape_, t, lanes):
        out = np.zeros(shape_)
        vals = []
        for tok in toks:
            if t == "f32":
                vals.append(c.as_f(tok, m).astype(np.float64))
            else:
                vals += [_to_float(h, t) for h in halves(tok, False)]
        for (r, col), v in zip(frag, vals):
            out[r, col] = v[lanes]
        return out

    for wp in np.unique(c.warp[m]).tolist():
        lanes = np.arange(wp * 32, wp * 32 + 32)
        if not m[lanes].all():
            raise SimError(f"{op}: warp {wp} has {int(m[lanes].sum())} of 32 lanes here")
        A = gather(regs[1], fa, (16, k), ta, lanes)
        B = gather(regs[2], fb, (k, 8), tb, lanes)
        C = gather(regs[3], fcd, (16, 8), tc, lanes)
        D = A @ B + C
        mm = np.zeros(c.n, bool)
        mm[lanes] = True
        if td == "f32":
            for i, tok in enumerate(regs[0]):
                full = np.zeros(c.n)
                full[lanes] = D[fcd[i]]
                c.putf(tok, full, mm)
        else:
            for i, tok in enumerate(regs[0]):
                lo = D[fcd[2 * i]].astype(np.float16).view(np.uint16).astype(np.uint32)
                hi = D[fcd[2 * i + 1]].astype(np.float16).view(np.uint16).astype(np.uint32)
                full = np.zeros(c.n, np.uint32)
                full[lanes] = lo | (hi << np.uint32(16))
                c.put(tok, full, mm)


def _cp_async(c: _CTA, op: str, ops: list[str], m: np.ndarray, tids: np.ndarray) -> None:
    """``cp.async.{ca,cg}.shared.global``, ``cp.async.commit_group``, ``cp.async.wait_group
    n`` and ``cp.async.wait_all`` (the model: ``_CTA.cp_async``)."""
    if op in ("cp.async.ca.shared.global", "cp.async.cg.shared.global"):
        dst, src = c.phys(c.address(ops[0], m)), c.address(ops[1], m)
        size = int(ops[2])
        n = c.as_u(ops[3], m, 32) if len(ops) > 3 else np.full(c.n, size, np.uint32)
        for t in tids.tolist():
            c.cp_async(int(dst[t]), int(src[t]), size, int(n[t]), t)
        return
    if op == "cp.async.commit_group":
        for t in tids.tolist():
            c.cpa_groups.setdefault(t, []).append(c.cpa_open.pop(t, []))
        return
    if op not in ("cp.async.wait_group", "cp.async.wait_all"):
        raise SimError(f"unsupported {op}")
    keep = int(ops[0]) if op == "cp.async.wait_group" else 0
    for t in tids.tolist():
        groups = c.cpa_groups.get(t, [])
        if op == "cp.async.wait_all":
            groups = groups + [c.cpa_open.pop(t, [])]
        cut = max(len(groups) - keep, 0)
        for g in groups[:cut]:
            for r in g:
                mine = c.cpa_tid[r] == t
                c.cpa_flight[r[mine]] = False
                c.cpa_epoch[r[mine]] = c.epoch
        c.cpa_groups[t] = groups[cut:]


def _named_barrier(c: _CTA, op: str, ops: list[str], m: np.ndarray, pcs: np.ndarray) -> None:
    """``bar.sync id, n`` / ``bar.arrive id, n``: a round completes when ``n`` threads have
    arrived; ``bar.sync`` threads wait (park) until then. A completed round orders the
    participants' shared accesses like a ``bar.sync`` of the CTA."""
    ids = c.as_u(ops[0], m, 32).astype(np.int64) + 16 * c.rank   # 16 barriers per CTA
    cnt = c.as_u(ops[1], m, 32)
    wait = op.startswith("bar.sync")
    for b in np.unique(ids[m]).tolist():
        sel = m & (ids == b)
        need = np.unique(cnt[sel])
        if need.size != 1 or need[0] % 32:
            raise SimError(f"{op}: thread count must be one multiple of 32 per barrier")
        st = c.named.setdefault(b, [0, []])
        st[0] += int(sel.sum())
        st[1] += np.nonzero(sel)[0].tolist()
        if st[0] > need[0]:
            raise SimError(f"named barrier {b}: {st[0]} threads arrived for a count of {need[0]}")
        if st[0] < need[0]:
            if wait:
                c.parked[sel] = True
                c.parked_on[sel] = -(b + 2)
                pcs[sel] += 1
            continue
        who = np.array(st[1])
        c.named[b] = [0, []]
        woken = c.parked & (c.parked_on == -(b + 2))
        c.parked[woken] = False
        c.parked_on[woken] = -1
        c.epoch += 1
        for seen in c.seen.values():
            seen[who] = seen[who].max()


def _mbarrier(c: _CTA, op: str, ops: list[str], m: np.ndarray, spin: bool) -> None:
    parts = op.split(".")
    if "multicast" in op:
        raise SimError(f"unsupported {op}")
    kind = parts[1]
    tids = np.nonzero(m)[0]
    if kind == "init":
        addr, cnt = c.bar_addrs(ops[0], m), c.as_u(ops[1], m, 32)
        for t in tids:
            if not 1 <= int(cnt[t]) < 1 << 20:
                raise SimError(f"mbarrier.init count {int(cnt[t])} outside 1..2**20-1")
            c.bars[int(addr[t])] = _Bar(int(cnt[t]))
    elif kind == "inval":
        for a in np.unique(c.bar_addrs(ops[0], m)[m]).tolist():
            c.bars.pop(a, None)
    elif kind == "expect_tx" or (kind == "arrive" and parts[2] == "expect_tx"):
        arrive = kind == "arrive"
        addr = c.bar_addrs(ops[1] if arrive else ops[0], m)
        tx = c.as_u(ops[2] if arrive else ops[1], m, 32)
        for t in tids:
            a = int(addr[t])
            b = c.barrier(a)
            b.tx += int(tx[t])
            b.pending -= arrive
            c.settle(a)
    elif kind == "arrive":
        addr = c.bar_addrs(ops[1], m)
        cnt = c.as_u(ops[2], m, 32) if len(ops) > 2 else np.ones(c.n, np.uint32)
        state = np.zeros(c.n, np.uint64)
        for t in tids:
            a = int(addr[t])
            b = c.barrier(a)
            state[t] = b.phase
            b.pending -= int(cnt[t])
            c.settle(a)
        if ops[0] != "_":
            c.put(ops[0], state, m)
    elif kind == "try_wait":
        parity = parts[2] == "parity"
        addr = c.bar_addrs(ops[1], m)
        want = c.as_u(ops[2], m, 32 if parity else 64).astype(np.int64)
        ok = np.zeros(c.n, bool)
        on = np.full(c.n, -1, np.int64)
        for a in np.unique(addr[m]).tolist():
            b = c.barrier(a)
            sel = m & (addr == a)
            # parity P: the phase of parity P completed once the current phase's parity is not P;
            # a state from mbarrier.arrive: the phase it arrived on completed
            ok[sel] = ((b.phase & 1) != (want[sel] & 1)) if parity else (b.phase > want[sel])
            seen = c.seen.setdefault(a, np.zeros(c.n, np.int64))
            seen[sel & ok] = b.phase
            c.acq_step[sel & ok] = np.maximum(c.acq_step[sel & ok], b.done_at)
            on[sel] = a
        c.put(ops[0], ok, m)
        if spin:  # a thread that would spin parks (does not advance) until a phase completes
            c.parked |= m & ~ok
            c.parked_on[m & ~ok] = on[m & ~ok]
    else:
        raise SimError(f"unsupported {op}")


# ---------------------------------------------------------------------- tensor cores
_SWIZZLE_WIDTH = {0: None, 1: 32, 2: 64, 3: 128}   # CUtensorMapSwizzle -> bytes
_DESC_WIDTH = {0: None, 1: 128, 2: 64, 3: 32}      # wgmma descriptor bits 62-63 -> bytes


def _swizzle(addr: np.ndarray, width: int | None) -> np.ndarray:
    """Shared byte addresses after a ``width``-byte swizzle: the 16-byte chunk index (bits 4..)
    XOR-ed with the 128-byte row index (bits 7..), ``width / 16`` chunks wide."""
    if width is None:
        return addr
    return addr ^ (((addr >> 7) & (width // 16 - 1)) << 4)


def _box(params, coords: list[int]) -> tuple[int, np.ndarray, np.ndarray]:
    """A tile copy's box: element bytes, each element's global byte offset (box order, dim 0
    fastest) and whether it lies inside the tensor."""
    if params.interleave.value or any(s != 1 for s in params.element_strides):
        raise SimError("unsupported tensor map (interleave or element strides)")
    e = _DTYPE_BYTES[params.data_type.name]
    box, dims = params.box_dims, params.global_dims
    strides = (e,) + tuple(params.global_strides)
    grids = np.meshgrid(*[np.arange(b) for b in reversed(box)], indexing="ij")
    idx = [g.reshape(-1) for g in reversed(grids)]   # idx[d]: index along dim d, dim 0 fastest
    off = np.zeros(idx[0].size, np.int64)
    inside = np.ones(idx[0].size, bool)
    for d, i in enumerate(idx):
        g = coords[d] + i
        inside &= (g >= 0) & (g < dims[d])
        off += g * strides[d]
    return e, off, inside


def _to_float(raw: np.ndarray, t: str) -> np.ndarray:
    """float64 values of raw element bits of type ``t``."""
    if t == "bf16":
        return (raw.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    if t == "f16":
        return raw.astype(np.uint16).view(np.float16).astype(np.float64)
    if t == "tf32":
        return (raw.astype(np.uint32) & 0xFFFFE000).view(np.float32).astype(np.float64)
    if t in ("e4m3", "e5m2"):
        m_bits = 3 if t == "e4m3" else 2
        bias = 7 if t == "e4m3" else 15
        r = raw.astype(np.int64)
        sign = np.where(r & 0x80, -1.0, 1.0)
        ex = (r >> m_bits) & ((1 << (7 - m_bits)) - 1)
        man = r & ((1 << m_bits) - 1)
        val = np.where(ex == 0, man / (1 << m_bits) * 2.0 ** (1 - bias),
                       (1 + man / (1 << m_bits)) * 2.0 ** (ex.astype(np.float64) - bias))
        return sign * val
    raise SimError(f"unsupported wgmma operand type {t}")


_ELEM = {"bf16": 2, "f16": 2, "tf32": 4, "e4m3": 1, "e5m2": 1}


class _Memory:
    def __init__(self, arrays: list[np.ndarray]) -> None:
        self.bufs = [np.frombuffer(np.ascontiguousarray(a).tobytes(), np.uint8).copy()
                     for a in arrays]
        self.written = [np.zeros(len(b), bool) for b in self.bufs]
        #: per tensor-map parameter: (TmaParams, index of the argument buffer it maps)
        self.tmaps: list = []
        #: per scalar parameter (``ptx.scalar_param``): its value
        self.scalars: dict = {}

    def locate(self, addr: np.ndarray, size: int, what: str) -> tuple[int, np.ndarray]:
        idx = (addr - np.uint64(_GLOBAL_BASE)) // np.uint64(_GLOBAL_STRIDE)
        if len(set(idx.tolist())) != 1:
            raise SimError(f"{what}: one instruction touches several buffers")
        i = int(idx[0])
        if not 0 <= i < len(self.bufs):
            raise SimError(f"{what}: address {int(addr[0]):#x} is in no argument buffer")
        off = (addr - np.uint64(_GLOBAL_BASE + i * _GLOBAL_STRIDE)).astype(np.int64)
        bad = (off < 0) | (off + size > len(self.bufs[i]))
        if bad.any():
            raise SimError(f"{what}: out of bounds of buffer {i} (size {len(self.bufs[i])} B) "
                           f"at offset {int(off[bad][0])}, {size} bytes")
        if (off % size).any():
            raise SimError(f"{what}: misaligned {size}-byte access at offset {int(off[(off % size) != 0][0])}")
        return i, off


def _vec(opcode: str) -> tuple[int, str]:
    parts = opcode.split(".")
    n = 1
    for p in parts:
        if p in ("v2", "v4", "v8"):
            n = int(p[1:])
    return n, parts[-1]


def _exec(c: _CTA, ins: tuple, m: np.ndarray, pcs: np.ndarray, done: np.ndarray, pc: int) -> None:
    guard, op, ops, raw = ins
    if guard is not None:
        g = c.as_p(guard[0], m)
        m = m & (~g if guard[1] else g)
    base = op.split(".")[0]
    t = op.split(".")[-1]
    try:
        if base == "bra":
            tgt = c.p.labels[ops[0]]
            pcs[m] = tgt
            return
        if base == "ret" or base == "exit":
            for t in np.nonzero(m)[0].tolist():
                if c.bulk_open.get(t) or any(c.bulk_groups.get(t, [])):
                    raise SimError(f"thread {t} exits with bulk stores in flight (no "
                                   "cp.async.bulk.wait_group retired them)")
            done[m] = True
            for r in np.unique(c.rank[m]).tolist():
                if c.tmem_allocs[r] and done[c.rank == r].all():
                    raise SimError(f"CTA {r} of the cluster exits with tensor memory columns "
                                   f"{sorted(c.tmem_allocs[r].items())} (first, count) "
                                   "allocated (no tcgen05.dealloc)")
            return
        if base == "bar" and (len(ops) > 1 or op.startswith("bar.arrive")):
            if m.any():
                _named_barrier(c, op, ops, m, pcs)
            return
        if base == "bar":
            if op.startswith("bar.sync"):  # what any thread saw complete, all threads now see
                c.epoch += 1
                for seen in c.seen.values():
                    seen[:] = seen.max()
            return
        if base in ("griddepcontrol", "setmaxnreg"):  # one grid at a time; registers unmodelled
            return
        if base == "barrier" and ".cluster." in op + ".":
            # arrive: nothing to do here; wait: every live thread of the cluster is here (the
            # scheduler checks), so what any thread saw complete, all threads now see
            if op.startswith("barrier.cluster.wait"):
                c.epoch += 1
                for seen in c.seen.values():
                    seen[:] = seen.max()
            return
        if base == "wgmma" and not op.startswith("wgmma.mma_async"):  # computed at issue
            return
        if base == "prefetch" or op.startswith("cp.async.bulk.prefetch.tensor"):  # hints
            return
        if not m.any():
            return
        tids = np.nonzero(m)[0]
        if base == "ld" and ".param" in op:
            name = ops[1].strip("[]")
            if name in c.mem.scalars:  # ptx.scalar_param: the value of the launch record
                value = c.mem.scalars[name]
                if isinstance(value, float):
                    c.putf(ops[0], np.full(c.n, value), m)
                else:
                    c.put(ops[0], np.full(c.n, value, np.int64).astype(np.uint64), m)
                return
            c.put(ops[0], np.full(c.n, _GLOBAL_BASE + c.p.params.index(name) * _GLOBAL_STRIDE,
                                  np.uint64), m)
        elif base == "cvta":
            c.put(ops[0], c.as_u(ops[1], m, 64), m)
        elif base == "mov" and (ops[0].startswith("{") or ops[1].startswith("{")):
            # vector pack / unpack: mov.b32 {lo, hi}, r / mov.b32 r, {lo, hi} (.b64 too)
            bits = int(op.split(".")[-1][1:])
            vec, scalar = (ops[0], ops[1]) if ops[0].startswith("{") else (ops[1], ops[0])
            parts = [x.strip() for x in vec.strip("{}").split(",")]
            w = bits // len(parts)
            if ops[0].startswith("{"):
                v = c.as_u(scalar, m, bits).astype(np.uint64)
                for i, tok in enumerate(parts):
                    if tok != "_":
                        c.put(tok, (v >> np.uint64(i * w)) & np.uint64((1 << w) - 1), m)
            else:
                v = np.zeros(c.n, np.uint64)
                for i, tok in enumerate(parts):
                    v |= c.as_u(tok, m, w).astype(np.uint64) << np.uint64(i * w)
                c.put(scalar, v, m)
        elif base == "mov":
            src = c.get(ops[1], m)
            if isinstance(src, float):
                c.putf(ops[0], np.full(c.n, src), m)
            elif isinstance(src, int):
                c.put(ops[0], np.full(c.n, src & (2**64 - 1), np.uint64), m)
            else:
                c.put(ops[0], src, m)
        elif base in ("add", "sub", "mul", "max", "min", "neg") and t == "f32":
            a = c.as_f(ops[1], m)
            if base == "neg":
                c.putf(ops[0], -a, m)
            else:
                b = c.as_f(ops[2], m)
                r = {"add": np.add, "sub": np.subtract, "mul": np.multiply,
                     "max": np.fmax, "min": np.fmin}[base](a, b)
                c.putf(ops[0], r, m)
        elif base == "fma":
            a, b, d = (c.as_f(o, m).astype(np.float64) for o in ops[1:4])
            c.putf(ops[0], a * b + d, m)
        elif base in ("rsqrt", "ex2", "rcp", "lg2", "sqrt", "tanh") and t == "f32":
            a = c.as_f(ops[1], m).astype(np.float64)
            with np.errstate(all="ignore"):
                r = {"rsqrt": lambda v: 1.0 / np.sqrt(v), "ex2": np.exp2,
                     "rcp": lambda v: 1.0 / v, "lg2": np.log2, "sqrt": np.sqrt,
                     "tanh": np.tanh}[base](a)
            c.putf(ops[0], r, m)
        elif base in ("div", "rem", "min", "max", "shr", "abs") and t in ("s32", "s64"):
            bits = 64 if t == "s64" else 32
            si = np.int64 if bits == 64 else np.int32
            a = c.as_u(ops[1], m, bits).view(si).astype(np.int64)
            if base == "abs":
                r = np.abs(a)
            elif base == "shr":  # arithmetic
                r = a >> c.as_u(ops[2], m, 32).astype(np.int64)
            else:
                b = c.as_u(ops[2], m, bits).view(si).astype(np.int64)
                bb = np.where(b == 0, 1, b)
                q = np.trunc(a / bb).astype(np.int64)  # C division rounds toward zero
                r = {"div": q, "rem": a - q * bb, "min": np.minimum(a, b),
                     "max": np.maximum(a, b)}[base]
            c.put(ops[0], r.astype(np.uint64), m)
        elif base in ("add", "sub", "mul", "mad", "shl", "shr", "and", "or", "xor", "min", "max") \
                or (base in ("div", "rem") and t in ("u32", "u64")):
            if t == "pred":
                a, b = c.as_p(ops[1], m), c.as_p(ops[2], m)
                c.put(ops[0], {"and": a & b, "or": a | b, "xor": a ^ b}[base], m)
                return
            bits = 64 if t.endswith("64") else 32
            if ".wide." in op:   # 32 x 32 -> 64 bits (s32: sign-extended); mad adds a 64-bit c
                a, b = c.as_u(ops[1], m, 32), c.as_u(ops[2], m, 32)
                if t.startswith("s"):
                    a, b = (x.astype(np.uint32).view(np.int32).astype(np.int64).astype(np.uint64)
                            for x in (a, b))
                else:
                    a, b = a.astype(np.uint64), b.astype(np.uint64)
                r = a * b
                if base == "mad":
                    r = r + c.as_u(ops[3], m, 64).astype(np.uint64)
                c.put(ops[0], r, m)
                return
            a = c.as_u(ops[1], m, bits).astype(np.uint64)
            if base in ("shl", "shr"):
                s = c.as_u(ops[2], m, 32).astype(np.uint64)
                r = (a << s) if base == "shl" else (a >> s)
            else:
                b = c.as_u(ops[2], m, bits).astype(np.uint64)
                r = {"add": lambda: a + b, "sub": lambda: a - b, "mul": lambda: a * b,
                     "and": lambda: a & b, "or": lambda: a | b, "xor": lambda: a ^ b,
                     "min": lambda: np.minimum(a, b), "max": lambda: np.maximum(a, b),
                     "div": lambda: a // np.maximum(b, 1), "rem": lambda: a % np.maximum(b, 1),
                     "mad": lambda: a * b + c.as_u(ops[3], m, bits).astype(np.uint64)}[base]()
            c.put(ops[0], r, m)
        elif base == "setp":
            cmp = op.split(".")[1]
            if t == "f32":
                a, b = c.as_f(ops[1], m), c.as_f(ops[2], m)
            else:
                bits = 64 if t.endswith("64") else 32
                a, b = c.as_u(ops[1], m, bits), c.as_u(ops[2], m, bits)
                if t.startswith("s"):  # two's complement: reinterpret, then widen
                    si = np.int32 if bits == 32 else np.int64
                    a, b = a.view(si).astype(np.int64), b.view(si).astype(np.int64)
            r = {"lt": a < b, "le": a <= b, "gt": a > b, "ge": a >= b, "eq": a == b,
                 "ne": a != b}[cmp]
            c.put(ops[0], r, m)
        elif base == "selp":
            p = c.as_p(ops[3], m)
            if t == "f32":
                c.putf(ops[0], np.where(p, c.as_f(ops[1], m), c.as_f(ops[2], m)), m)
            else:
                c.put(ops[0], np.where(p, c.as_u(ops[1], m, 64), c.as_u(ops[2], m, 64)), m)
        elif base == "cvt":
            parts = op.split(".")
            if parts[-2:] == ["f32", "bf16"]:
                c.put(ops[0], c.as_u(ops[1], m, 32) << np.uint32(16), m)
            elif parts[-2:] == ["bf16", "f32"]:
                c.put(ops[0], _bf16_rne(c.as_f(ops[1], m)), m)
            elif parts[-2:] == ["f32", "f16"]:
                c.putf(ops[0], c.as_u(ops[1], m, 16).view(np.float16).astype(np.float64), m)
            elif parts[-2:] == ["f16", "f32"]:
                c.put(ops[0], c.as_f(ops[1], m).astype(np.float16).view(np.uint16), m)
            elif parts[-2:] == ["f16x2", "f32"]:
                clamp = (lambda v: np.maximum(v, np.float32(0))) if "relu" in parts else (lambda v: v)
                hi = clamp(c.as_f(ops[1], m)).astype(np.float16).view(np.uint16).astype(np.uint32)
                lo = clamp(c.as_f(ops[2], m)).astype(np.float16).view(np.uint16).astype(np.uint32)
                c.put(ops[0], (hi << np.uint32(16)) | lo, m)
            elif parts[-2:] == ["bf16x2", "f32"]:
                clamp = (lambda v: np.maximum(v, np.float32(0))) if "relu" in parts else (lambda v: v)
                hi = _bf16_rne(clamp(c.as_f(ops[1], m))).astype(np.uint32)
                lo = _bf16_rne(clamp(c.as_f(ops[2], m))).astype(np.uint32)
                c.put(ops[0], (hi << np.uint32(16)) | lo, m)
            elif parts[-1][0] in "usb" and parts[-2][0] in "usb" and parts[-1][1:].isdigit() \
                    and parts[-2][1:].isdigit():  # integer widen / narrow
                sb = int(parts[-1][1:])
                v = c.as_u(ops[1], m, sb).astype(np.uint64)
                if parts[-1][0] == "s":
                    v = v.view(np.int64) if sb == 64 else \
                        (v.astype(np.int64) ^ (1 << (sb - 1))) - (1 << (sb - 1))
                c.put(ops[0], np.asarray(v).astype(np.int64).astype(np.uint64), m)
            elif parts[-2] == "f32" and parts[-1] in ("s32", "u32"):
                v = c.as_u(ops[1], m, 32)
                v = v.view(np.int32) if parts[-1] == "s32" else v
                c.putf(ops[0], v.astype(np.float64), m)
            elif parts[-2] in ("s32", "u32") and parts[-1] == "f32":
                v = c.as_f(ops[1], m).astype(np.float64)
                rnd = {"rzi": np.trunc, "rni": np.rint, "rmi": np.floor, "rpi": np.ceil}
                mode = next((rnd[x] for x in parts if x in rnd), None)
                if mode is None:
                    raise SimError(f"unsupported {op}")
                c.put(ops[0], mode(v).astype(np.int64).astype(np.uint64), m)
            else:
                raise SimError(f"unsupported {op}")
        elif base == "shfl":
            if not op.startswith("shfl.sync.bfly"):
                raise SimError(f"unsupported {op}")
            for w in np.unique(c.warp[m]):
                lanes = m[c.warp == w]
                if lanes.size != 32 or not lanes.all():
                    raise SimError(f"{raw}: shfl.sync with full mask but warp {w} has "
                                   f"{int(lanes.sum())} of 32 lanes here")
            a = c.as_u(ops[1], m, 32)
            b = int(c.get(ops[2], m)) if not ops[2].startswith("%") else None
            cc = int(c.get(ops[3], m))
            if b is None:
                raise SimError("register shuffle lane offsets are not supported")
            seg, cval = (cc >> 8) & 0x1F, cc & 0x1F
            lane = c.lane
            maxl = (lane & seg) | (cval & ~seg & 0x1F)
            j = lane ^ b
            j = np.where(j > maxl, lane, j)
            src = c.warp * 32 + j
            c.put(ops[0], a[src], m)
        elif base == "fence":  # fence.proxy.async: the caller's ordinary shared writes are fenced
            if op.startswith("fence.proxy.async"):
                c.wr_fenced |= np.append(m, False)[c.wr_tid]
        elif base == "mbarrier":
            _mbarrier(c, op, ops, m, pc in c.p.spins)
        elif base in ("red", "atom") and ".global" in op:
            # one thread after another, in thread order (any order is a valid schedule)
            parts = [x for x in op.split(".") if x not in ("v2", "v4")]
            nvec = 4 if ".v4." in op else 2 if ".v2." in op else 1
            kind, et = parts[-2], parts[-1]
            es = max(_BITS[et] // 8, 1)
            dt = {"f32": np.float32, "u32": np.uint32, "s32": np.int32, "b32": np.uint32,
                  "u64": np.uint64, "b64": np.uint64}.get(et)
            ops2 = {"add": np.add, "min": np.minimum, "max": np.maximum, "and": np.bitwise_and,
                    "or": np.bitwise_or, "exch": lambda cur, v: v}
            if dt is None or (kind not in ops2 and kind != "cas"):
                raise SimError(f"unsupported {op}")
            addr = c.address(ops[0] if base == "red" else ops[1], m)
            if nvec > 1:  # red.global.add.v2.f32 [a], {x, y}: element-wise, one word at a time
                if base != "red" or kind != "add":
                    raise SimError(f"unsupported {op}")
                words = [x.strip() for x in ops[1].strip("{}").split(",")]
                i, off = c.mem.locate(addr[m], es * nvec, raw)
                for j, tok in enumerate(words):
                    v = c.as_u(tok, m, es * 8).view(dt)
                    for k, t in enumerate(tids.tolist()):
                        word = c.mem.bufs[i][off[k] + j * es:off[k] + (j + 1) * es].view(dt)
                        word[0] = word[0] + v[t]
                    c.mem.written[i][(off[:, None] + np.arange(j * es, (j + 1) * es)).reshape(-1)] = True
                return
            i, off = c.mem.locate(addr[m], es, raw)
            cell = c.mem.bufs[i]
            vals = c.as_u(ops[1] if base == "red" else ops[2], m, es * 8).view(dt)
            swap = c.as_u(ops[3], m, es * 8).view(dt) if kind == "cas" else None
            old = np.zeros(c.n, dt)
            for k, t in enumerate(tids.tolist()):
                word = cell[off[k]:off[k] + es].view(dt)
                old[t] = word[0]
                if kind == "cas":  # atom.cas d, [a], b, c: *a = (*a == b) ? c : *a
                    word[0] = swap[t] if word[0] == vals[t] else word[0]
                else:
                    word[0] = ops2[kind](word[0], vals[t])
                c.mem.written[i][off[k]:off[k] + es] = True
            if base == "atom":
                c.put(ops[0], old.view(_NP[es * 8]), m)
        elif base == "mapa":  # mapa.shared::cluster.u32 d, a, rank: a in CTA ``rank``'s window
            a = c.phys(c.address(ops[1], m)) % c.S
            r = c.as_u(ops[2], m, 32).astype(np.int64)
            if (r[m] >= c.csize).any():
                raise SimError(f"{op}: CTA rank past the {c.csize}-CTA cluster")
            c.put(ops[0], (_CLUSTER_TAG | (r * c.S + a)).astype(np.uint64), m)
        elif base == "vote":
            kind = op.split(".")[2]
            src = c.as_p(ops[1], m)
            out = np.zeros(c.n, np.uint32 if kind == "ballot" else bool)
            for wp in np.unique(c.warp[m]).tolist():
                lanes = np.arange(wp * 32, wp * 32 + 32)
                if not m[lanes].all():
                    raise SimError(f"{op}: warp {wp} has {int(m[lanes].sum())} of 32 lanes here")
                v = src[lanes]
                out[lanes] = {"any": v.any(), "all": v.all(), "uni": v.all() or not v.any(),
                              "ballot": int(sum(1 << i for i in range(32) if v[i]))}[kind]
            c.put(ops[0], out, m)
        elif base == "wgmma":
            _wgmma(c, op, ops, m)
        elif base == "tcgen05":
            _tcgen05(c, op, ops, m, tids)
        elif base == "stmatrix":
            _stmatrix(c, op, ops, m)
        elif base == "ldmatrix":
            _ldmatrix(c, op, ops, m)
        elif base == "mma" and op.startswith("mma.sync.aligned."):
            _mma_sync(c, op, ops, m)
        elif op.startswith("cp.async.") and not op.startswith("cp.async.bulk"):
            _cp_async(c, op, ops, m, tids)
        elif base == "bfe" and t in ("u32", "s32"):
            a = c.as_u(ops[1], m, 32).astype(np.uint64)
            pos, ln = c.as_u(ops[2], m, 32).astype(np.uint64), c.as_u(ops[3], m, 32).astype(np.uint64)
            if t == "s32":
                raise SimError(f"unsupported {op}")
            c.put(ops[0], (a >> pos) & ((np.uint64(1) << ln) - np.uint64(1)), m)
        elif op.startswith("cp.async.bulk.tensor") and ".global.mbarrier::complete_tx" in op:
            dst = c.phys(c.address(ops[0], m))
            tm, crd = ops[1].strip("[]").split(",", 1)
            bar = c.bar_addrs(ops[2], m)
            mask = c.as_u(ops[3], m, 16) if "multicast" in op else None
            for t in tids.tolist():
                params, buf = _tmap(c, tm.strip(), m, t)
                coords = _coords(c, crd.strip(), m, t)
                # multicast: the same CTA-relative offsets in every CTA of the mask
                ranks = [int(c.rank[t])] if mask is None else \
                    [r for r in range(16) if int(mask[t]) >> r & 1]
                for r in ranks:
                    if r >= c.csize:
                        raise SimError(f"{op}: multicast mask {int(mask[t]):#x} names CTA {r} "
                                       f"of a {c.csize}-CTA cluster")
                    shift = (r - int(c.rank[t])) * c.S
                    _tma_load(c, int(dst[t]) + shift, params, buf, coords, int(bar[t]) + shift, t)
        elif op.startswith(("cp.async.bulk.tensor", "cp.reduce.async.bulk.tensor")) \
                and ".global.shared::cta" in op:
            tm, crd = ops[0].strip("[]").split(",", 1)
            src = c.phys(c.address(ops[1], m))
            kind = "store" if op.startswith("cp.async") else op.split(".")[-3]
            for t in tids.tolist():
                params, buf = _tmap(c, tm.strip(), m, t)
                _tma_store(c, params, buf, _coords(c, crd.strip(), m, t), int(src[t]), t, kind)
        elif base == "createpolicy":  # an opaque L2 hint: ld/st with .L2::cache_hint ignore it
            c.put(ops[0], np.zeros(c.n, np.uint64), m)
        elif op.startswith(("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes",
                            "cp.async.bulk.shared::cta.global.mbarrier::complete_tx::bytes")):
            if "multicast" in op:
                raise SimError(f"unsupported {op}")
            dst, src = c.phys(c.address(ops[0], m)), c.address(ops[1], m)
            n, bar = c.as_u(ops[2], m, 32), c.bar_addrs(ops[3], m)
            for t in tids.tolist():
                c.bulk_load(int(dst[t]), int(src[t]), int(n[t]), int(bar[t]), t)
        elif op.startswith("cp.async.bulk.global.shared::cta.bulk_group"):
            dst, src, n = c.address(ops[0], m), c.phys(c.address(ops[1], m)), c.as_u(ops[2], m, 32)
            for t in tids.tolist():
                c.bulk_store(int(dst[t]), int(src[t]), int(n[t]), t)
        elif op == "cp.async.bulk.commit_group":
            for t in tids.tolist():
                c.bulk_groups.setdefault(t, []).append(c.bulk_open.pop(t, []))
        elif op in ("cp.async.bulk.wait_group", "cp.async.bulk.wait_group.read"):
            # both retire the groups: the model's stores have read and written at issue
            keep = int(ops[0])
            for t in tids.tolist():
                g = c.bulk_groups.get(t, [])
                c.bulk_groups[t] = g[len(g) - keep:] if keep else []
        elif op.startswith("cp.async.bulk.prefetch.L2.global"):  # a hint: only check the range
            addr = c.address(ops[0], m)[m]
            nb = c.as_u(ops[1], m, 32)[m].astype(np.int64)
            i, off = c.mem.locate(addr, 1, raw)
            if ((off % 16) != 0).any() or ((nb % 16) != 0).any() or (nb <= 0).any():
                raise SimError(f"{raw}: bulk prefetch needs a 16-byte aligned start and a "
                               "positive multiple of 16 bytes")
            if (off + nb > len(c.mem.bufs[i])).any():
                raise SimError(f"{raw}: bulk prefetch past the end of buffer {i}")
        elif base in ("ld", "st") and (".shared" in op or ".global" in op):
            n, et = _vec(op)
            es = max(_BITS[et] // 8, 1)
            size = n * es
            if base == "ld":
                dst = ops[0].strip("{}").split(",") if ops[0].startswith("{") else [ops[0]]
                dst = [d.strip() for d in dst]
                addr = c.address(ops[1], m)
            else:
                dst = ops[1].strip("{}").split(",") if ops[1].startswith("{") else [ops[1]]
                dst = [d.strip() for d in dst]
                addr = c.address(ops[0], m)
            am = addr[m]
            if ".shared" in op:
                off = c.phys(addr)[m]
                # shared::cluster: any CTA's window of the cluster (a mapa address)
                loc, top = (off, c.S * c.csize) if "::cluster" in op else (off - c.rank[m] * c.S, c.S)
                if ((loc < 0) | (loc + size > top)).any():
                    raise SimError(f"{raw}: shared access out of bounds")
                if (off % size).any():
                    raise SimError(f"{raw}: misaligned shared access")
                buf, wr = c.smem, c.smem_written
            else:
                i, off = c.mem.locate(am, size, raw)
                buf, wr = c.mem.bufs[i], c.mem.written[i]
            idx = off[:, None] + np.arange(size)[None, :]
            if ".shared" in op:
                c.track_shared(base == "st", idx, tids)
            if base == "ld":
                if ".shared" in op and not wr[idx].all():
                    raise SimError(f"{raw}: reads shared memory nothing wrote")
                data = buf[idx].copy().view(_NP[es * 8]).reshape(-1, n)
                for k, d in enumerate(dst):
                    full = np.zeros(c.n, _NP[es * 8])
                    full[m] = data[:, k]
                    c.put(d, full, m)
            else:
                vals = np.stack([c.as_u(s, m, es * 8)[m] for s in dst], axis=1)
                buf[idx] = vals.astype(_NP[es * 8]).view(np.uint8).reshape(idx.shape)
                wr[idx] = True
        else:
            raise SimError(f"unsupported instruction {op}")
    except SimError as e:
        if str(e).startswith("PTX line"):
            raise
        raise SimError(f"PTX line {pc}: {raw}: {e}") from None


def _run_cta(prog: _Prog, mem: _Memory, block, grid, cta, max_steps: int, csize: int = 1) -> None:
    c = _CTA(prog, mem, block, grid, cta, csize)
    pcs = np.zeros(c.n, np.int64)
    done = np.zeros(c.n, bool)
    steps = 0
    while not done.all():
        live = ~done
        ready = live & ~c.parked
        if not ready.any():
            raise SimError(f"CTA {cta}: deadlock: every live thread waits on an mbarrier phase "
                           f"that nothing will complete: {c.deadlock()}")
        pc = int(pcs[ready].min())
        sel = ready & (pcs == pc)
        if pc >= len(prog.code):
            raise SimError("ran off the end of the kernel without ret")
        ins = prog.code[pc]
        cta_wide = ins[1].startswith("bar.sync") and len(ins[2]) < 2 and ins[0] is None
        if cta_wide or ins[1].startswith("barrier.cluster.wait"):
            scope = np.isin(c.rank, np.unique(c.rank[sel])) if cta_wide else np.ones(c.n, bool)
            if not sel[live & scope].all():
                why = f" ({c.deadlock()})" if c.parked.any() else ""
                raise SimError(f"PTX line {pc}: {ins[3]}: only {int(sel.sum())} of "
                               f"{int((live & scope).sum())} live threads reach the barrier{why}")
        before = pcs.copy()
        c.step = steps
        _exec(c, ins, sel, pcs, done, pc)
        adv = sel & (pcs == before) & ~done & ~c.parked
        pcs[adv] += 1
        steps += 1
        if steps > max_steps:
            raise SimError("step limit reached (an endless loop?)")


def run(spec, inputs: list[np.ndarray], *, poison: bool = True,
        max_steps: int = 2_000_000, inplace: bool = False,
        scratch: tuple[int, ...] = ()) -> list[np.ndarray]:
    """Run a pyptx ``Specialization`` on numpy inputs; return its outputs as numpy arrays.

    Outputs are allocated from the spec's shapes and dtypes (bf16 as uint16
    bits); with ``poison`` they start as NaN bit patterns and every byte must be
    written, else ``SimError``. ``inplace``: ``inputs`` are written back too (a kernel that
    adds into an input buffer, like an accumulator of tile reductions). ``scratch``: indices
    of outputs that are workspaces (poisoned, but not every byte need be written).
    """
    prog = _Prog(spec.ptx(), spec.smem)
    outs = []
    for shape, s in zip(spec.out_shapes, spec.kernel.out_specs):
        es = s.dtype.bytes
        dt = {2: np.uint16, 4: np.uint32, 8: np.uint64}[es]
        fill = {2: 0x7FC1, 4: 0x7FC00001, 8: 0x7FF8000000000001}[es] if poison else 0
        outs.append(np.full(shape, fill, dt))
    arrays = [np.ascontiguousarray(a) for a in inputs] + outs
    mem = _Memory(arrays)
    mem.tmaps = [(params, i) for i, params in spec.tma_maps]
    mem.scalars = {name: value for name, _, value in getattr(spec, "scalar_params", ())}
    cl = tuple(spec.cluster) if spec.cluster else (1, 1, 1)
    csize = max(cl[0], 1)
    if max(cl[1], 1) != 1 or max(cl[2], 1) != 1 or spec.grid[0] % csize:
        raise SimError(f"clusters {cl} are modelled along x only, over a grid of whole clusters")
    gx, gy, gz = spec.grid
    for z in range(gz):
        for y in range(gy):
            for x in range(0, gx, csize):  # a cluster's CTAs run together
                _run_cta(prog, mem, spec.block, spec.grid, (x, y, z), max_steps, csize)
    res = []
    n_in = len(inputs)
    for k, o in enumerate(outs):
        i = n_in + k
        if poison and k not in scratch and not mem.written[i].all():
            miss = int((~mem.written[i]).sum())
            raise SimError(f"output {k}: {miss} of {len(mem.written[i])} bytes never written")
        res.append(mem.bufs[i].view(o.dtype).reshape(o.shape).copy())
    if inplace:
        for k, a in enumerate(inputs):
            if not (isinstance(a, np.ndarray) and a.flags.c_contiguous and a.flags.writeable):
                raise SimError(f"inplace: input {k} must be a writeable C-contiguous array")
            a.view(np.uint8).reshape(-1)[:] = mem.bufs[k]
    return res
