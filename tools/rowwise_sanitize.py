"""Check every row-wise kernel once on a GPU at small, ragged sizes; made for compute-sanitizer.

Runs the forward kernels (RMSNorm, LayerNorm, softmax, SwiGLU; the first three
also persistent, ``ctas=P`` for each ``--ctas`` value; RMSNorm and LayerNorm also
through the TMA ring, ``ctas=P, stages=S`` for each ``--stages`` value) and the
RMSNorm/LayerNorm backward pairs for f32 and bf16 on fresh random inputs with
NaN-poisoned outputs, compares each with a float64 torch reference (relative
L2 error below 1e-5 for f32, 2e-2 for bf16) and prints one line per case and
PASS or FAIL. Under the sanitizer:

    compute-sanitizer --tool memcheck python tools/rowwise_sanitize.py
    python tools/rowwise_sanitize.py --sizes 3x7,5x1000,2x4097

``--tuned`` also checks the builders' default calls, which ``pyptx.autotune`` tunes at
their first launch (many timed launches per size: leave it out under the sanitizer).
"""

import argparse

from pyptx_kernels.rows import RowConfig, layer_norm, rms_norm, softmax, swiglu

SIZES = "3x7,5x33,7x1000,3x4097,2x8192"
CTAS = "2,264"
STAGES = "2,3"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default=SIZES, help=f"BxN,... (default {SIZES})")
    ap.add_argument("--ctas", default=CTAS,
                    help=f"persistent CTA counts P,... ('' for none; default {CTAS})")
    ap.add_argument("--stages", default=STAGES,
                    help=f"TMA ring depths S,... ('' for none; default {STAGES})")
    ap.add_argument("--tuned", action="store_true",
                    help="also check the default (autotuned) call of each forward builder")
    a = ap.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print("rowwise_check.py needs a CUDA GPU")
        return 2
    import pyptx_torch.eager as eager

    eager.POISON = True
    F = torch.nn.functional
    dts = {"f32": torch.float32, "bf16": torch.bfloat16}
    failures = 0

    def check(name, got, want, tol):
        nonlocal failures
        got = got.double()
        err = ((got - want).norm() / want.norm().clamp_min(1e-300)).item()
        ok = bool(torch.isfinite(got).all()) and err < tol
        failures += not ok
        print(f"{'ok  ' if ok else 'FAIL'} {name}: rel err {err:.2e} (tol {tol:g})", flush=True)

    for size in a.sizes.split(","):
        B, N = (int(v) for v in size.split("x"))
        for dt, tdt in dts.items():
            tol = 1e-5 if dt == "f32" else 2e-2

            def r(*shape, scale=1.0, shift=0.0, tdt=tdt):
                return (torch.randn(*shape, device="cuda") * scale + shift).to(tdt)

            x, w, b, u, dy = r(B, N, scale=2, shift=0.3), r(N, scale=0.1, shift=1), r(N, scale=0.1), \
                r(B, N), r(B, N)
            x64, w64, b64, u64, dy64 = (t.double() for t in (x, w, b, u, dy))
            tag = f"{dt} {B}x{N}"
            nopdl = RowConfig(pdl=False)
            check(f"rms_norm {tag}", rms_norm.build_rms_norm_fast(B, N, dt, config=nopdl)(x, w),
                  F.rms_norm(x64, (N,), w64, 1e-6), tol)
            check(f"layer_norm {tag}", layer_norm.build_layer_norm(B, N, dt, config=nopdl)(x, w, b),
                  F.layer_norm(x64, (N,), w64, b64, 1e-5), tol)
            check(f"softmax {tag}", softmax.build_softmax_fast(B, N, dt, config=nopdl)(x),
                  torch.softmax(x64, -1), tol)
            check(f"swiglu {tag}", swiglu.build_swiglu(B, N, dt, config=nopdl)(x, u), F.silu(x64) * u64, tol)
            # programmatic dependent launch (the builders' default): back to back, each reading
            # the previous output; the L2 prefetch before griddepcontrol.wait included
            y = rms_norm.build_rms_norm_fast(B, N, dt, config=RowConfig())(x, w)
            z = softmax.build_softmax_fast(B, N, dt, config=RowConfig())(y)
            check(f"rms_norm pdl {tag}", y, F.rms_norm(x64, (N,), w64, 1e-6), tol)
            check(f"rms_norm -> softmax pdl {tag}", z, torch.softmax(y.double(), -1), tol)
            check(f"swiglu pdl {tag}", swiglu.build_swiglu(B, N, dt, config=RowConfig())(x, u),
                  F.silu(x64) * u64, tol)
            check(f"layer_norm pdl {tag}", layer_norm.build_layer_norm(B, N, dt, config=RowConfig())(x, w, b),
                  F.layer_norm(x64, (N,), w64, b64, 1e-5), tol)
            if a.tuned:  # the variant pyptx.autotune picks for this shape on this device
                check(f"rms_norm tuned {tag}", rms_norm.build_rms_norm_fast(B, N, dt)(x, w),
                      F.rms_norm(x64, (N,), w64, 1e-6), tol)
                check(f"layer_norm tuned {tag}", layer_norm.build_layer_norm(B, N, dt)(x, w, b),
                      F.layer_norm(x64, (N,), w64, b64, 1e-5), tol)
                check(f"softmax tuned {tag}", softmax.build_softmax_fast(B, N, dt)(x),
                      torch.softmax(x64, -1), tol)
                check(f"swiglu tuned {tag}", swiglu.build_swiglu(B, N, dt)(x, u),
                      F.silu(x64) * u64, tol)
            if B * N * x.element_size() % 16 == 0:  # slices by bulk copy, chained under PDL
                for st in (False, True):
                    sw = swiglu.build_swiglu(B, N, dt, config=RowConfig(bulk=True, bulk_store=st,
                                                                      threads=128))
                    y = sw(x, u)
                    z = sw(y, u)
                    what = f"swiglu bulk{' bulk_store' if st else ''} {tag}"
                    check(what, y, F.silu(x64) * u64, tol)
                    check(f"swiglu -> {what}", z, F.silu(y.double()) * u64, tol)
            for P in (int(v) for v in a.ctas.split(",") if v):
                if N <= 16384:
                    check(f"rms_norm ctas={P} {tag}",
                          rms_norm.build_rms_norm_fast(B, N, dt, config=RowConfig(ctas=P))(x, w),
                          F.rms_norm(x64, (N,), w64, 1e-6), tol)
                    check(f"softmax ctas={P} {tag}", softmax.build_softmax_fast(B, N, dt, config=RowConfig(ctas=P))(x),
                          torch.softmax(x64, -1), tol)
                if N <= 8192:
                    check(f"layer_norm ctas={P} {tag}",
                          layer_norm.build_layer_norm(B, N, dt, config=RowConfig(ctas=P))(x, w, b),
                          F.layer_norm(x64, (N,), w64, b64, 1e-5), tol)
                if N * x.element_size() % 16:
                    continue  # the ring copies rows in 16-byte granules
                for S in (int(v) for v in a.stages.split(",") if v):
                    for bulk in (False, True):
                        ring = f"ring ctas={P} stages={S}{' bulk_store' if bulk else ''} {tag}"
                        y = rms_norm.build_rms_norm_fast(B, N, dt, config=RowConfig(
                            ctas=P, stages=S, bulk_store=bulk))(x, w)
                        z = layer_norm.build_layer_norm(B, N, dt, config=RowConfig(
                            ctas=P, stages=S, bulk_store=bulk))(y, w, b)
                        check(f"rms_norm {ring}", y, F.rms_norm(x64, (N,), w64, 1e-6), tol)
                        check(f"rms_norm -> layer_norm {ring}", z,
                              F.layer_norm(y.double(), (N,), w64, b64, 1e-5), tol)
            if N > 8192:
                continue
            xg, wg, bg = (t.clone().requires_grad_() for t in (x64, w64, b64))
            F.rms_norm(xg, (N,), wg, 1e-6).backward(dy64)
            dx, dw = rms_norm.build_rms_norm_bwd(B, N, dt)(x, w, dy)
            check(f"rms_norm_bwd dx {tag}", dx, xg.grad, tol)
            check(f"rms_norm_bwd dw {tag}", dw, wg.grad, tol)
            xg, wg, bg = (t.clone().requires_grad_() for t in (x64, w64, b64))
            F.layer_norm(xg, (N,), wg, bg, 1e-5).backward(dy64)
            dx, dw, db = layer_norm.build_layer_norm_bwd(B, N, dt)(x, w, dy)
            check(f"layer_norm_bwd dx {tag}", dx, xg.grad, tol)
            check(f"layer_norm_bwd dw {tag}", dw, wg.grad, tol)
            check(f"layer_norm_bwd db {tag}", db, bg.grad, tol)
    torch.cuda.synchronize()
    print("PASS" if not failures else f"FAIL ({failures} cases)")
    return 0 if not failures else 1


if __name__ == "__main__":
    raise SystemExit(main())
