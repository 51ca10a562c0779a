"""The GEMM's main loops: the producer thread's ring of A/B tile copies (``produce``), the
consumers' wgmma over the ring (``consumer_mma``) and the consumers' walks over their tiles,
each tile's k-blocks then its epilogue: cooperative (``cooperative_loop``) and split tail
(``split_tail_loop``)."""

from __future__ import annotations

from pyptx import ptx
from pyptx.warpspec import RingMma, load_ab_ring


def produce(pipe, A, B, a_tile, b_tile, *, cfg, sched, base, rank, cid, multicast):
    """The producer thread's loop: every k-block of this cluster's tiles (or split-tail
    pieces) copied into the ring; with a cluster, the shared B tile is
    split between the CTAs and multicast to both."""
    work, items = sched.work(cid)
    load_ab_ring(pipe, A, B, a_tile, b_tile, base=base, tile_range=work,
                 coords=lambda t: sched.coords(t, rank),
                 num_kb=sched.num_kb, BK=cfg.BK, rank=rank, cluster=cfg.cluster,
                 multicast=multicast, split=cfg.split, wait_scope=cfg.wait_scope,
                 items=items and (lambda j: items(j)[:3]))


def consumer_mma(pipe, accs, a_tile, b_tile, *, cfg, base, w, leader, dt, multicast):
    """The ``RingMma`` of consumer warpgroup ``w``: its 64-row bands of the A tile (all of
    against the whole B tile, into ``accs``."""
    consumers, bands = cfg.consumers, cfg.bands
    if bands > 1:  # this warpgroup's bands of 64 rows of A
        rows0 = base + w * a_tile.offset(0, 64 * bands) if consumers > 1 else base
        a_descs = [a_tile.descriptor(rows0 + h * a_tile.offset(0, 64) if h else rows0)
                   for h in range(bands)]
    else:  # this warpgroup's 64 rows of A
        a_descs = [a_tile.descriptor(base + w * a_tile.offset(0, 64) if consumers > 1
                                     else base)]
    b_desc0 = b_tile.descriptor(base, offset=a_tile.nbytes)
    return RingMma(pipe, accs if bands > 1 else accs[0], a_tile, b_tile,
                   a_descs if bands > 1 else a_descs[0], b_desc0, a_tile.nbytes + b_tile.nbytes,
                   n=cfg.BN, dtype=dt.name, leader=leader, wait_scope=cfg.wait_scope,
                   cta_ranks=range(cfg.cluster) if multicast else None, sem=cfg.remote_sem)


def cooperative_loop(mma, sched, *, cid, rank, epilogue):
    """The persistent walk: tiles ``cid, cid + clusters, ...`` (``sched.work``), each split
    between the consumer warpgroups."""
    for t in ptx.loop(*sched.work(cid)[0]):
        m0, n0 = sched.coords(t, rank)
        mma.run(sched.num_kb)
        epilogue(m0, n0)


def split_tail_loop(mma, sched, fixup, *, cid, rank, epilogue):
    """Whole tiles, then pieces of the tail: a piece other than its tile's last chunk
    shares its partial sum (``fixup.share``); the last chunk takes the others' and runs the
    epilogue."""
    waves, _, nsplit = sched.plan
    work, items = sched.work(cid)
    for j in ptx.loop(*work):
        t, kb0, kb1, chunk = items(j)
        mma.run(kb1 - kb0)
        tail = t - waves * sched.clusters
        with ptx.if_(chunk < nsplit - 1):
            fixup.share(tail, chunk)
        with ptx.else_():
            with ptx.if_(chunk == nsplit - 1):
                fixup.take(tail)
            m0, n0 = sched.coords(t, rank)
            epilogue(m0, n0)
