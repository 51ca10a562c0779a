"""A tick model of the D=128 attention backward's dK/dV grid on P SMs: how many block-steps
the launch order and the ordered dQ adds cost before a kernel is written.

One CTA per (head, 128-row kv block), one per SM; a tick is one 64-row q block of one CTA.
A CTA's add into q block i waits until its predecessor there (the kv block of the rank before
it) has added, ``lat`` ticks earlier. CTAs start in grid order as SMs free up.

    python tools/attn_schedule_model.py            # the benchmark's shapes, every schedule

Schedules: ``rotated`` (full attention, deterministic default: kv block j starts at q block
2j, predecessor j + 1, grid last kv block first), ``free`` (the same grid with no waits: the
any-order mode), ``causal_last`` (causal default: ranks from the diagonal down, grid last kv
block first), ``causal_longest`` (the same ranks, kv block 0 launched first), ``wavefront``
(persistent CTAs, units round-robin, every kv block after the previous one at each q block).
"""
import argparse


def simulate(units, P, visits, pred, lat=0):
    """Ticks until every unit is done. ``units``: (head, kv block) in launch order (a list
    per persistent CTA when P lists are given); ``visits(j)``: kv block j's q blocks in order;
    ``pred(h, j, i)``: the unit whose add at q block i must come first, or None."""
    persistent = isinstance(units[0], list)
    queues = units if persistent else None
    nxt, running, done, t, busy = 0, {}, {}, 0, 0
    left = sum(len(q) for q in queues) if persistent else len(units)
    while left:
        for sm in range(P):
            if sm in running:
                continue
            if persistent and queues[sm]:
                running[sm] = [*queues[sm].pop(0), 0]
            elif not persistent and nxt < len(units):
                running[sm] = [*units[nxt], 0]
                nxt += 1
        for sm, (h, j, s) in list(running.items()):
            qs = visits(j)
            i = qs[s]
            p = pred(h, j, i)
            if p is None or done.get((h, p, i), t) + lat < t:
                done[(h, j, i)] = t
                busy += 1
                if s + 1 == len(qs):
                    del running[sm]
                    left -= 1
                else:
                    running[sm][2] = s + 1
        t += 1
    return t, busy / (t * P)


def schedule(name, heads, S, P, lat=0):
    """(ticks, busy fraction) of schedule ``name`` at ``heads`` heads of length ``S``."""
    nq, nkv = S // 64, S // 128
    last_first = [(h, j) for h in range(heads) for j in reversed(range(nkv))]
    if name in ("rotated", "free"):
        def visits(j):
            return [(2 * j + s) % nq for s in range(nq)]

        def pred(h, j, i):
            if name == "free" or (i - 2 * j) % nq < 2:
                return None
            return (j + 1) % nkv
        return simulate(last_first, P, visits, pred, lat)
    if name.startswith("causal"):
        order = last_first if name == "causal_last" else [
            (h, j) for h in range(heads) for j in range(nkv)]

        def visits(j):
            return list(range(2 * j, nq))

        def pred(h, j, i):
            return j + 1 if j + 1 < nkv and i >= 2 * (j + 1) else None
        return simulate(order, P, visits, pred, lat)
    if name == "wavefront":
        flat = [(h, j) for h in range(heads) for j in range(nkv)]
        return simulate([flat[c::P] for c in range(P)], P, lambda j: list(range(nq)),
                        lambda h, j, i: j - 1 if j else None, lat)
    raise ValueError(name)


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--sms", type=int, default=132)
    a = p.parse_args()
    for S, heads in ((4096, 128), (8192, 64), (4096, 132)):
        full = heads * (S // 128) * (S // 64) / a.sms
        causal = heads * sum(S // 64 - 2 * j for j in range(S // 128)) / a.sms
        print(f"S={S}, {heads} heads, {a.sms} SMs: ideal {full:.0f} ticks full, "
              f"{causal:.0f} causal")
        for name in ("free", "rotated", "causal_last", "causal_longest", "wavefront"):
            for lat in (0, 1):
                t, busy = schedule(name, heads, S, a.sms, lat)
                print(f"  {name:15s} lat={lat}: {t:5d} ticks, SMs busy {busy:.3f}")
