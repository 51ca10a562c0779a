"""The Blackwell GEMM's main loop (untested on hardware): the producer thread's TMA ring
(``produce``, the Hopper GEMM's ``load_ab_ring``), the peer CTA's relay of its filled stages
to the MMA CTA (``relay``, 2-CTA plans) and the one thread that issues ``tcgen05.mma`` over
the ring into tensor memory (``issue_mma``)."""

from __future__ import annotations

from pyptx import ptx
from pyptx.ptx import mbarrier, tcgen05
from pyptx.warpspec import load_ab_ring


def produce(pipe, A, B, a_tile, b_tile, *, base, m0, nb0, num_kb, BK):
    """This CTA's k-blocks of its A rows (from ``m0``) and B rows (from ``nb0``) copied into
    the ring, each stage completing on its own ``full`` barrier."""
    load_ab_ring(pipe, A, B, a_tile, b_tile, base=base, tile_range=(0, 1),
                 coords=lambda t: (m0, nb0), num_kb=num_kb, BK=BK)


def relay(pipe, peer_full, *, num_kb):
    """2-CTA plans, in the odd CTA: for each k-block, wait until this CTA's stage landed and
    arrive on the even CTA's ``peer_full`` barrier of that stage (``mapa`` + a remote
    arrive), so the MMA thread there knows both halves are in."""
    st = pipe.consumer_state()
    for _ in ptx.loop(0, num_kb):
        pipe.wait(st)
        mbarrier.arrive(ptx.cluster.map_shared(peer_full.at(st.stage), 0), remote=True,
                        sem="release.cluster")
        st.advance()


def issue_mma(pipe, a_tile, b_tile, *, base, stage_bytes, d, idesc, num_kb, done,
              peer_full=None):
    """The MMA thread: per k-block, wait for the stage (and, with ``peer_full``, for the odd
    CTA's half of it), issue ``BK / 16`` ``tcgen05.mma`` into the accumulator at TMEM
    address ``d`` (overwriting it on the first), and commit: the stage's ``empty`` barrier
    gets an arrival when those MMAs finished reading it (in both CTAs of a pair). After the
    last k-block the ``done`` barrier gets one."""
    cg = idesc.cta_group
    mask = 0b11 if cg == 2 else None
    st = pipe.consumer_state()
    for kb in ptx.loop(0, num_kb):
        pipe.wait(st)
        if peer_full is not None:
            mbarrier.wait(peer_full.at(st.stage), st.phase, scope="cluster")
        tcgen05.fence_after_thread_sync()
        sbase = base + st.stage * stage_bytes
        a0 = a_tile.descriptor(sbase, target="tcgen05")
        b0 = b_tile.descriptor(sbase, offset=a_tile.nbytes, target="tcgen05")
        for ks in range(a_tile.k_steps):
            tcgen05.mma(d, a_tile.advance(a0, ks), b_tile.advance(b0, ks), idesc,
                        enable_input_d=(kb != 0) if ks == 0 else 1)
        tcgen05.commit(pipe.empty.at(st.stage), cta_group=cg, multicast_mask=mask)
        st.advance()
    tcgen05.commit(done, cta_group=cg, multicast_mask=mask)
