"""One tiny model that calls every public function of ``pyptx_kernels`` goes through
``torch.compile(fullgraph=True)``: on the CPU with meta tensors (dynamo sees one graph of
``torch.ops.pyptx.*`` ops, AOT autograd traces their fakes and backward ops, nothing
launches), and on the GPU for real, where the compiled model equals the eager one."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import pyptx_kernels as pk  # noqa: E402

BF = torch.bfloat16
FP8 = torch.float8_e4m3fn
OPS = {"matmul", "linear", "grouped_mm", "scaled_mm", "scaled_mm_blockwise", "attention",
       "attention_varlen", "rms_norm", "layer_norm", "softmax", "swiglu", "add_rms_norm",
       "rotary", "attention_with_kvcache", "swiglu_linear", "linear_residual",
       "linear_cross_entropy"}
D, H, HKV, HD, G, V = 256, 4, 2, 64, 2, 512
B0, S0 = 2, 128   # the inputs' batch and sequence length (the targets and tables are buffers)


class EveryOp(torch.nn.Module):
    """A block that threads one activation through every public op and returns it with a
    language-model loss."""

    def __init__(self):
        super().__init__()
        gen = torch.Generator().manual_seed(0)
        p = lambda *s: torch.nn.Parameter((torch.randn(*s, generator=gen) / 16).to(BF))  # noqa: E731
        self.norm, self.ln_w, self.ln_b = p(D), p(D), p(D)
        self.qkv, self.out = p((H + 2 * HKV) * HD, D), p(D, H * HD)
        self.up, self.experts = p(2 * D, D), p(G, D, D)
        self.proj, self.gated, self.head = p(D, D), p(2 * D, D), p(V, D)
        self.register_buffer("w8", (torch.randn(D, D, generator=gen) / 16).to(FP8))
        angles = torch.arange(S0)[:, None] * 0.01 * torch.arange(HD)[None, :]
        self.register_buffer("cos", angles.cos().to(BF))
        self.register_buffer("sin", angles.sin().to(BF))
        self.register_buffer("seqlens", torch.full((B0,), S0, dtype=torch.int32))
        self.register_buffer("target", torch.randint(0, V, (B0, S0), generator=gen))

    def forward(self, x, offs, cu_seqlens, max_seqlen):
        B, S, _ = x.shape
        h = pk.rms_norm(x, self.norm)
        q, k, v = pk.linear(h, self.qkv).split([H * HD, HKV * HD, HKV * HD], dim=-1)
        q, k, v = (t.reshape(B, S, -1, HD) for t in (q, k, v))
        q, k = pk.apply_rotary(q, k, self.cos, self.sin, layout="bshd")
        a = pk.attention(q, k, v, causal=True)
        # the last position decoding against the sequence as its cache (forward only)
        a = a + pk.attention_with_kvcache(q[:, -1:].detach(), k.detach().contiguous(),
                                          v.detach().contiguous(), self.seqlens)
        a = a + pk.attention_varlen(q.reshape(B * S, H, HD), k.reshape(B * S, HKV, HD),
                                    v.reshape(B * S, HKV, HD), cu_seqlens, cu_seqlens,
                                    max_seqlen, max_seqlen, causal=True).reshape(B, S, H, HD)
        h = h + pk.matmul(a.reshape(B, S, H * HD), self.out.T)
        n, h = pk.add_rms_norm(pk.linear_residual(h, self.proj, h), h, self.norm)
        h = h + pk.swiglu_linear(n, self.gated)
        g, u = pk.linear(h, self.up).chunk(2, dim=-1)
        t = pk.grouped_mm(pk.swiglu(g, u).reshape(B * S, D), self.experts, offs)
        t8 = t.detach().to(FP8)  # the fp8 products take no gradient
        one = torch.ones(1, dtype=torch.float32, device=x.device)
        t = pk.scaled_mm(t8, self.w8.t(), one, one)
        blocks_a = torch.ones(B * S, D // 128, dtype=torch.float32, device=x.device)
        blocks_b = torch.ones(D // 128, D // 128, dtype=torch.float32, device=x.device)
        t = t + pk.scaled_mm_blockwise(t8, self.w8.t(), blocks_a, blocks_b)
        h = pk.layer_norm(h + t.reshape(B, S, D), self.ln_w, self.ln_b)
        return pk.softmax(h), pk.linear_cross_entropy(h, self.head, self.target)


def _inputs(device, B=B0, S=S0):
    x = torch.randn(B, S, D, device=device).to(BF) if device != "meta" else \
        torch.empty(B, S, D, dtype=BF, device=device)
    offs = torch.tensor([B * S // 2, B * S], dtype=torch.int32, device=device)
    cu = torch.tensor([0, S, B * S], dtype=torch.int32, device=device)
    return x, offs, cu, S


def _ops_in(gm):
    return {str(n.target).removeprefix("pyptx.").removesuffix(".default")
            for n in gm.graph.nodes if n.op == "call_function" and
            str(n.target).startswith("pyptx.")}


def test_every_op_in_one_graph_on_meta_tensors():
    graphs = []

    def record(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    torch._dynamo.reset()
    model = EveryOp().to("meta")
    y, loss = torch.compile(model, fullgraph=True, backend=record)(*_inputs("meta"))
    assert y.shape == (2, 128, D) and y.dtype == BF
    assert loss.shape == () and loss.dtype == torch.float32
    assert len(graphs) == 1 and _ops_in(graphs[0]) == OPS, _ops_in(graphs[0]) ^ OPS
    torch._dynamo.reset()


def test_every_op_traces_forward_and_backward_fakes():
    torch._dynamo.reset()
    model = EveryOp().to("meta")
    x, offs, cu, S = _inputs("meta")
    x.requires_grad_(True)
    y, loss = torch.compile(model, fullgraph=True, backend="aot_eager")(x, offs, cu, S)
    (y.float().sum() + loss).backward()
    assert x.grad is not None and x.grad.shape == x.shape
    for name in ("norm", "qkv", "proj", "gated", "head"):
        assert getattr(model, name).grad is not None, name
    torch._dynamo.reset()


@pytest.mark.gpu
def test_every_op_compiled_equals_eager_on_the_gpu():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    torch._dynamo.reset()
    model = EveryOp().cuda()
    args = _inputs("cuda")
    eager, eager_loss = model(*args)
    compiled, compiled_loss = torch.compile(model, fullgraph=True)(*args)
    torch.cuda.synchronize()
    assert torch.isfinite(eager.float()).all() and torch.isfinite(eager_loss)
    torch.testing.assert_close(compiled.float(), eager.float(), atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(compiled_loss, eager_loss, atol=2e-2, rtol=2e-2)
    torch._dynamo.reset()
