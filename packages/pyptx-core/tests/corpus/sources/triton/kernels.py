"""Triton kernels compiled ahead of time for sm_90 (no GPU needed): the corpus's Triton PTX.

    python kernels.py OUT_DIR

Each entry of ``CASES`` is (output stem, kernel, signature, constexprs, options).
Needs only ``pip install triton``.
``triton.compile`` with ``GPUTarget("cuda", 90, 32)`` lowers the kernel to PTX
without touching a device.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")

import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402

# PTX ISA 9.0: what CUDA 13.0's ptxas (the one the tests run) accepts; Triton's own
# bundled ptxas would otherwise make it write a newer .version.
PTX_VERSION = 90


@triton.jit
def add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=m) + tl.load(y_ptr + offs, mask=m), mask=m)


@triton.jit
def softmax_kernel(out_ptr, in_ptr, in_stride, out_stride, n_cols, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    x = tl.load(in_ptr + row * in_stride + cols, mask=cols < n_cols, other=-float("inf"))
    x = x - tl.max(x, axis=0)
    num = tl.exp(x)
    tl.store(out_ptr + row * out_stride + cols, num / tl.sum(num, axis=0), mask=cols < n_cols)


@triton.jit
def layernorm_kernel(X, Y, W, B, Mean, Rstd, stride, N, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    X += row * stride
    Y += row * stride
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for off in range(0, N, BLOCK):
        cols = off + tl.arange(0, BLOCK)
        acc += tl.load(X + cols, mask=cols < N, other=0.).to(tl.float32)
    mean = tl.sum(acc, axis=0) / N
    var = tl.zeros([BLOCK], dtype=tl.float32)
    for off in range(0, N, BLOCK):
        cols = off + tl.arange(0, BLOCK)
        x = tl.load(X + cols, mask=cols < N, other=0.).to(tl.float32)
        x = tl.where(cols < N, x - mean, 0.)
        var += x * x
    rstd = 1 / tl.sqrt(tl.sum(var, axis=0) / N + eps)
    tl.store(Mean + row, mean)
    tl.store(Rstd + row, rstd)
    for off in range(0, N, BLOCK):
        cols = off + tl.arange(0, BLOCK)
        mask = cols < N
        x = tl.load(X + cols, mask=mask, other=0.).to(tl.float32)
        y = (x - mean) * rstd * tl.load(W + cols, mask=mask) + tl.load(B + cols, mask=mask)
        tl.store(Y + cols, y, mask=mask)


@triton.jit
def matmul_kernel(a_ptr, b_ptr, c_ptr, M, N, K, sam, sak, sbk, sbn, scm, scn,
                  BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP: tl.constexpr,
                  ACT: tl.constexpr):
    pid = tl.program_id(0)
    num_m = tl.cdiv(M, BM)
    num_n = tl.cdiv(N, BN)
    group = pid // (GROUP * num_n)
    first_m = group * GROUP
    gm = min(num_m - first_m, GROUP)
    pid_m = first_m + (pid % (GROUP * num_n)) % gm
    pid_n = (pid % (GROUP * num_n)) // gm
    offs_m = (pid_m * BM + tl.arange(0, BM)) % M
    offs_n = (pid_n * BN + tl.arange(0, BN)) % N
    offs_k = tl.arange(0, BK)
    a_ptrs = a_ptr + offs_m[:, None] * sam + offs_k[None, :] * sak
    b_ptrs = b_ptr + offs_k[:, None] * sbk + offs_n[None, :] * sbn
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BK)):
        a = tl.load(a_ptrs, mask=offs_k[None, :] < K - k * BK, other=0.0)
        b = tl.load(b_ptrs, mask=offs_k[:, None] < K - k * BK, other=0.0)
        acc = tl.dot(a, b, acc)
        a_ptrs += BK * sak
        b_ptrs += BK * sbk
    if ACT == "leaky_relu":
        acc = tl.where(acc >= 0, acc, 0.01 * acc)
    c = acc.to(c_ptr.dtype.element_ty)
    cm = pid_m * BM + tl.arange(0, BM)
    cn = pid_n * BN + tl.arange(0, BN)
    tl.store(c_ptr + scm * cm[:, None] + scn * cn[None, :], c, mask=(cm[:, None] < M) & (cn[None, :] < N))


@triton.jit
def attn_fwd(Q, K, V, O, sm_scale, stride_m, N_CTX, HEAD: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr):  # noqa: E741
    start_m = tl.program_id(0)
    off_h = tl.program_id(1)
    offs_m = start_m * BM + tl.arange(0, BM)
    offs_n = tl.arange(0, BN)
    offs_d = tl.arange(0, HEAD)
    base = off_h * N_CTX * stride_m
    q = tl.load(Q + base + offs_m[:, None] * stride_m + offs_d[None, :])
    m_i = tl.zeros([BM], dtype=tl.float32) - float("inf")
    l_i = tl.zeros([BM], dtype=tl.float32) + 1.0
    acc = tl.zeros([BM, HEAD], dtype=tl.float32)
    qk_scale = sm_scale * 1.44269504
    for start_n in range(0, N_CTX, BN):
        k = tl.load(K + base + (start_n + offs_n)[None, :] * stride_m + offs_d[:, None])
        qk = tl.dot(q, k)
        m_ij = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)
        p = tl.math.exp2(qk * qk_scale - m_ij[:, None])
        alpha = tl.math.exp2(m_i - m_ij)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None]
        v = tl.load(V + base + (start_n + offs_n)[:, None] * stride_m + offs_d[None, :])
        acc = tl.dot(p.to(v.dtype), v, acc)
        m_i = m_ij
    acc = acc / l_i[:, None]
    tl.store(O + base + offs_m[:, None] * stride_m + offs_d[None, :], acc.to(O.dtype.element_ty))


@triton.jit
def cumsum_kernel(x_ptr, y_ptr, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + row * BLOCK + offs)
    tl.store(y_ptr + row * BLOCK + offs, tl.cumsum(x, axis=0))


@triton.jit
def dropout_kernel(x_ptr, out_ptr, n, p, seed, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    keep = tl.rand(seed, offs) > p
    tl.store(out_ptr + offs, tl.where(keep, x / (1 - p), 0.0), mask=mask)


@triton.jit
def histogram_kernel(x_ptr, hist_ptr, n, BINS: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < n, other=0)
    tl.atomic_add(hist_ptr + (x % BINS), 1, mask=offs < n)


@triton.jit
def math_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < n, other=1.0)
    y = tl.sin(x) * tl.cos(x) + tl.log(x) + tl.sqrt(x) + tl.math.rsqrt(x) + tl.sigmoid(x) + tl.erf(x)
    y += tl.extra.cuda.libdevice.tanh(x) + tl.extra.cuda.libdevice.pow(x, 1.5)
    tl.store(y_ptr + offs, y, mask=offs < n)


@triton.jit
def argmax_kernel(x_ptr, out_ptr, N, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + row * N + offs, mask=offs < N, other=-float("inf"))
    tl.store(out_ptr + row, tl.argmax(x, axis=0))


@triton.jit
def transpose_kernel(x_ptr, y_ptr, M, N, BM: tl.constexpr, BN: tl.constexpr):
    pm = tl.program_id(0)
    pn = tl.program_id(1)
    rm = pm * BM + tl.arange(0, BM)
    rn = pn * BN + tl.arange(0, BN)
    x = tl.load(x_ptr + rm[:, None] * N + rn[None, :], mask=(rm[:, None] < M) & (rn[None, :] < N))
    tl.store(y_ptr + rn[:, None] * M + rm[None, :], tl.trans(x), mask=(rn[:, None] < N) & (rm[None, :] < M))


@triton.jit
def sort_kernel(x_ptr, y_ptr, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + tl.program_id(0) * BLOCK + offs)
    tl.store(y_ptr + tl.program_id(0) * BLOCK + offs, tl.sort(x))


@triton.jit
def fp8_matmul(a_ptr, b_ptr, c_ptr, K, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    rm = tl.arange(0, BM)
    rn = tl.arange(0, BN)
    rk = tl.arange(0, BK)
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k in range(0, K, BK):
        a = tl.load(a_ptr + rm[:, None] * K + (k + rk)[None, :])
        b = tl.load(b_ptr + (k + rk)[:, None] * BN + rn[None, :])
        acc = tl.dot(a, b, acc)
    tl.store(c_ptr + rm[:, None] * BN + rn[None, :], acc.to(tl.float16))


P = "*fp32"
CASES = [
    ("add_f32_b1024", add_kernel, {"x_ptr": P, "y_ptr": P, "out_ptr": P, "n": "i32", "BLOCK": "constexpr"},
     {"BLOCK": 1024}, {}),
    ("add_f16_b256", add_kernel, {"x_ptr": "*fp16", "y_ptr": "*fp16", "out_ptr": "*fp16", "n": "i32",
                                  "BLOCK": "constexpr"}, {"BLOCK": 256}, {"num_warps": 2}),
    ("softmax_b1024", softmax_kernel, {"out_ptr": P, "in_ptr": P, "in_stride": "i32", "out_stride": "i32",
                                       "n_cols": "i32", "BLOCK": "constexpr"}, {"BLOCK": 1024}, {"num_warps": 8}),
    ("softmax_b8192", softmax_kernel, {"out_ptr": P, "in_ptr": P, "in_stride": "i32", "out_stride": "i32",
                                       "n_cols": "i32", "BLOCK": "constexpr"}, {"BLOCK": 8192}, {"num_warps": 16}),
    ("layernorm_f16", layernorm_kernel, {"X": "*fp16", "Y": "*fp16", "W": "*fp16", "B": "*fp16", "Mean": P,
                                         "Rstd": P, "stride": "i32", "N": "i32", "eps": "fp32",
                                         "BLOCK": "constexpr"}, {"BLOCK": 1024}, {"num_warps": 4}),
    ("matmul_f16_128x128x64", matmul_kernel,
     {"a_ptr": "*fp16", "b_ptr": "*fp16", "c_ptr": "*fp16", "M": "i32", "N": "i32", "K": "i32", "sam": "i32",
      "sak": "i32", "sbk": "i32", "sbn": "i32", "scm": "i32", "scn": "i32", "BM": "constexpr", "BN": "constexpr",
      "BK": "constexpr", "GROUP": "constexpr", "ACT": "constexpr"},
     {"BM": 128, "BN": 128, "BK": 64, "GROUP": 8, "ACT": ""}, {"num_warps": 8, "num_stages": 3}),
    ("matmul_bf16_64x64x32_leaky", matmul_kernel,
     {"a_ptr": "*bf16", "b_ptr": "*bf16", "c_ptr": "*bf16", "M": "i32", "N": "i32", "K": "i32", "sam": "i32",
      "sak": "i32", "sbk": "i32", "sbn": "i32", "scm": "i32", "scn": "i32", "BM": "constexpr", "BN": "constexpr",
      "BK": "constexpr", "GROUP": "constexpr", "ACT": "constexpr"},
     {"BM": 64, "BN": 64, "BK": 32, "GROUP": 8, "ACT": "leaky_relu"}, {"num_warps": 4, "num_stages": 4}),
    ("matmul_f32_tf32", matmul_kernel,
     {"a_ptr": P, "b_ptr": P, "c_ptr": P, "M": "i32", "N": "i32", "K": "i32", "sam": "i32",
      "sak": "i32", "sbk": "i32", "sbn": "i32", "scm": "i32", "scn": "i32", "BM": "constexpr", "BN": "constexpr",
      "BK": "constexpr", "GROUP": "constexpr", "ACT": "constexpr"},
     {"BM": 128, "BN": 64, "BK": 32, "GROUP": 4, "ACT": ""}, {"num_warps": 4, "num_stages": 2}),
    ("attn_fwd_d64", attn_fwd, {"Q": "*fp16", "K": "*fp16", "V": "*fp16", "O": "*fp16", "sm_scale": "fp32",
                                "stride_m": "i32", "N_CTX": "i32", "HEAD": "constexpr", "BM": "constexpr",
                                "BN": "constexpr"}, {"HEAD": 64, "BM": 128, "BN": 64}, {"num_warps": 8, "num_stages": 2}),
    ("attn_fwd_d128", attn_fwd, {"Q": "*bf16", "K": "*bf16", "V": "*bf16", "O": "*bf16", "sm_scale": "fp32",
                                 "stride_m": "i32", "N_CTX": "i32", "HEAD": "constexpr", "BM": "constexpr",
                                 "BN": "constexpr"}, {"HEAD": 128, "BM": 128, "BN": 128}, {"num_warps": 8, "num_stages": 2}),
    ("cumsum_i32", cumsum_kernel, {"x_ptr": "*i32", "y_ptr": "*i32", "BLOCK": "constexpr"}, {"BLOCK": 1024}, {}),
    ("dropout", dropout_kernel, {"x_ptr": P, "out_ptr": P, "n": "i32", "p": "fp32", "seed": "i32",
                                 "BLOCK": "constexpr"}, {"BLOCK": 1024}, {}),
    ("histogram", histogram_kernel, {"x_ptr": "*i32", "hist_ptr": "*i32", "n": "i32", "BINS": "constexpr",
                                     "BLOCK": "constexpr"}, {"BINS": 64, "BLOCK": 512}, {}),
    ("math_libdevice", math_kernel, {"x_ptr": P, "y_ptr": P, "n": "i32", "BLOCK": "constexpr"}, {"BLOCK": 256}, {}),
    ("argmax", argmax_kernel, {"x_ptr": P, "out_ptr": "*i32", "N": "i32", "BLOCK": "constexpr"}, {"BLOCK": 2048}, {}),
    ("transpose", transpose_kernel, {"x_ptr": "*fp16", "y_ptr": "*fp16", "M": "i32", "N": "i32", "BM": "constexpr",
                                     "BN": "constexpr"}, {"BM": 64, "BN": 64}, {}),
    ("sort_i32", sort_kernel, {"x_ptr": "*i32", "y_ptr": "*i32", "BLOCK": "constexpr"}, {"BLOCK": 256}, {}),
    ("fp8_matmul", fp8_matmul, {"a_ptr": "*fp8e4nv", "b_ptr": "*fp8e4nv", "c_ptr": "*fp16", "K": "i32",
                                "BM": "constexpr", "BN": "constexpr", "BK": "constexpr"},
     {"BM": 64, "BN": 128, "BK": 64}, {"num_warps": 4}),
]


def main(out_dir: str) -> None:
    out = Path(out_dir)
    target = GPUTarget("cuda", 90, 32)
    failed = []
    for stem, fn, sig, consts, opts in CASES:
        try:
            src = triton.compiler.ASTSource(fn, signature=sig, constexprs=consts)
            k = triton.compile(src, target=target, options={"ptx_version": PTX_VERSION, **opts})
        except Exception as e:  # report and go on: one kernel's failure should not stop the rest
            failed.append(f"{stem}: {type(e).__name__}: {e}")
            continue
        path = out / f"triton_{stem}_sm_90.ptx"
        path.write_text(k.asm["ptx"])
        print("wrote", path.name)
    if failed:
        sys.exit("\n".join(failed))


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else ".")
