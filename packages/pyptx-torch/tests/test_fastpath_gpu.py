"""GPU tests of the C++ fast path (``pyptx_torch._fastpath``): repeats, fallbacks, compile, graphs.

Outputs here come from the C++ plan's own allocation, so they cannot be
poisoned beforehand; every check uses fresh random inputs whose exact result
(a sum, a difference, a negation) an unwritten element cannot match.
Set ``PYPTX_REQUIRE_FASTPATH=1`` (the device check does) to fail instead of
skipping when the extension is not built.
"""

from __future__ import annotations

import os

import pytest

torch = pytest.importorskip("torch")

from pyptx import Tile, kernel, ptx, reg  # noqa: E402
from pyptx.errors import SpecError  # noqa: E402
from pyptx.types import f32, u32  # noqa: E402

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


@pytest.fixture(scope="module")
def fastpath():
    from pyptx_torch.fastpath import FASTPATH, fastpath_status

    if FASTPATH is None:
        if os.environ.get("PYPTX_REQUIRE_FASTPATH") == "1":
            pytest.fail(f"C++ fast path required: {fastpath_status()}")
        pytest.skip(fastpath_status())
    return FASTPATH


def first_fast(k):
    """The kernel's most recently used fast launcher."""
    return k.launcher("torch").state.fast[0]


def build_sum_diff():
    """(a, b) -> (a + b, a - b) over a symbolic length N: two outputs, any shape."""

    @kernel(in_specs=(Tile("N", f32), Tile("N", f32)), out_specs=(Tile("N", f32), Tile("N", f32)),
            grid=lambda N: ((N + 127) // 128, 1, 1), block=(128, 1, 1))
    def sum_diff(A, B, S, D):
        pa, pb, ps, pd = ptx.global_ptrs(A, B, S, D)
        i = reg.from_(ptx.special.ctaid.x(), u32) * 128 + reg.from_(ptx.special.tid.x(), u32)
        with ptx.if_(i < A.shape[0]):
            a, b = reg.scalar(f32), reg.scalar(f32)
            ptx.inst.ld.global_.f32(a, ptx.addr(pa + i * 4))
            ptx.inst.ld.global_.f32(b, ptx.addr(pb + i * 4))
            ptx.inst.st.global_.f32(ptx.addr(ps + i * 4), a + b)
            ptx.inst.st.global_.f32(ptx.addr(pd + i * 4), a - b)
        ptx.ret()

    return sum_diff


def build_diff():
    """(a, b) -> a - b over a symbolic length N: one output (the fixed-arity op)."""

    @kernel(in_specs=(Tile("N", f32), Tile("N", f32)), out_specs=(Tile("N", f32),),
            grid=lambda N: ((N + 127) // 128, 1, 1), block=(128, 1, 1))
    def diff(A, B, D):
        pa, pb, pd = ptx.global_ptrs(A, B, D)
        i = reg.from_(ptx.special.ctaid.x(), u32) * 128 + reg.from_(ptx.special.tid.x(), u32)
        with ptx.if_(i < A.shape[0]):
            a, b = reg.scalar(f32), reg.scalar(f32)
            ptx.inst.ld.global_.f32(a, ptx.addr(pa + i * 4))
            ptx.inst.ld.global_.f32(b, ptx.addr(pb + i * 4))
            ptx.inst.st.global_.f32(ptx.addr(pd + i * 4), a - b)
        ptx.ret()

    return diff


def build_diff_t():
    """(a, b) -> a - b with a template parameter BLOCK (the CTA size): kwargs variants."""

    @kernel(in_specs=(Tile("N", f32), Tile("N", f32)), out_specs=(Tile("N", f32),),
            grid=lambda N, BLOCK: ((N + BLOCK - 1) // BLOCK, 1, 1),
            block=lambda BLOCK: (BLOCK, 1, 1))
    def diff_t(A, B, D, *, BLOCK=128):
        pa, pb, pd = ptx.global_ptrs(A, B, D)
        i = reg.from_(ptx.special.ctaid.x(), u32) * BLOCK + reg.from_(ptx.special.tid.x(), u32)
        with ptx.if_(i < A.shape[0]):
            a, b = reg.scalar(f32), reg.scalar(f32)
            ptx.inst.ld.global_.f32(a, ptx.addr(pa + i * 4))
            ptx.inst.ld.global_.f32(b, ptx.addr(pb + i * 4))
            ptx.inst.st.global_.f32(ptx.addr(pd + i * 4), a - b)
        ptx.ret()

    return diff_t


@pytest.fixture
def unpoisoned():
    """Poisoning sends every call to Python on purpose: these tests count calls that stay in C++."""
    import pyptx_torch.eager as eager

    saved = eager.POISON
    eager.set_poison(False)
    yield
    eager.set_poison(saved)


def randn(*sizes):
    return [torch.randn(n, device="cuda") for n in sizes]


def check(k, a, b):
    s, d = k(a, b)
    assert s.shape == a.shape and s.dtype == a.dtype and s.device == a.device
    assert torch.equal(s, a + b) and torch.equal(d, a - b)


def test_repeat_calls_take_the_cpp_plan(fastpath):
    k = build_sum_diff()
    for _ in range(4):
        check(k, torch.randn(5000, device="cuda"), torch.randn(5000, device="cuda"))
    assert isinstance(first_fast(k), fastpath.Plan)
    a, b = torch.randn(5000, device="cuda"), torch.randn(5000, device="cuda")
    s, d = first_fast(k)((a, b))  # the plan alone launches and allocates
    assert torch.equal(s, a + b) and torch.equal(d, a - b)


def test_plan_declines_what_it_was_not_built_for(fastpath):
    k = build_sum_diff()
    a, b = torch.randn(300, device="cuda"), torch.randn(300, device="cuda")
    check(k, a, b)
    plan = first_fast(k)
    for args in [(a,), (a, b, b), (a, torch.randn(301, device="cuda")), (a, b.double()),
                 (a, b.cpu()), (a, torch.randn(600, device="cuda")[::2]), (a, 3), [a, b],
                 (a, torch.randn(300, device="meta"))]:
        assert plan(args) is None
    assert plan() is None and plan((a, b), extra=1) is None


def test_shape_change_falls_back_and_replans(fastpath):
    k = build_sum_diff()
    for n in (1000, 4097, 31, 1000):
        check(k, torch.randn(n, device="cuda"), torch.randn(n, device="cuda"))
    assert isinstance(first_fast(k), fastpath.Plan)


def test_bad_inputs_after_a_plan_still_raise_pyptx_errors(fastpath):
    k = build_sum_diff()
    a, b = torch.randn(256, device="cuda"), torch.randn(256, device="cuda")
    check(k, a, b)
    with pytest.raises(SpecError, match="dtype"):
        k(a, b.double())
    with pytest.raises(SpecError, match="CUDA tensors"):
        k(a, b.cpu())
    with pytest.raises(SpecError, match="not contiguous"):
        k(a, torch.randn(512, device="cuda")[::2])
    check(k, a, b)  # and the plan still works afterwards


def test_parameter_inputs(fastpath):
    k = build_sum_diff()
    a = torch.nn.Parameter(torch.randn(777, device="cuda"), requires_grad=False)
    b = torch.randn(777, device="cuda")
    for _ in range(2):
        check(k, a, b)


def test_side_stream_orders_with_the_stream(fastpath):
    k = build_sum_diff()
    a, b = torch.randn(1 << 20, device="cuda"), torch.randn(1 << 20, device="cuda")
    check(k, a, b)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        a2 = a * 3.0  # produced on s: the launch must be ordered after it on s
        out_s, out_d = k(a2, b)
    torch.cuda.current_stream().wait_stream(s)
    assert torch.equal(out_s, a * 3.0 + b) and torch.equal(out_d, a * 3.0 - b)


def test_cuda_graph_capture_through_the_plan(fastpath):
    k = build_sum_diff()
    a, b = torch.randn(4096, device="cuda"), torch.randn(4096, device="cuda")
    check(k, a, b)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, stream=s):
        out_s, out_d = k(a, b)
    for _ in range(3):
        a.copy_(torch.randn_like(a))
        b.copy_(torch.randn_like(b))
        g.replay()
        torch.cuda.synchronize()
        assert torch.equal(out_s, a + b) and torch.equal(out_d, a - b)


def test_torch_compile_uses_the_cpp_op_and_recovers_from_new_shapes(fastpath):
    k = build_sum_diff()

    @torch.compile(fullgraph=True, dynamic=False)
    def f(a, b):
        s, d = k(a * 2.0, b)
        return s + 1.0, d

    for n in (2048, 2048, 513, 2048):
        a, b = torch.randn(n, device="cuda"), torch.randn(n, device="cuda")
        s, d = f(a, b)
        assert torch.equal(s, (a * 2.0 + b) + 1.0) and torch.equal(d, a * 2.0 - b)
    before = fastpath.fallback_calls()
    for _ in range(5):  # a repeat of a bound shape never leaves C++
        a, b = torch.randn(2048, device="cuda"), torch.randn(2048, device="cuda")
        s, d = f(a, b)
        assert torch.equal(d, a * 2.0 - b)
    assert fastpath.fallback_calls() == before


def test_op_has_an_unboxed_autograd_kernel_and_outputs_match_eager(fastpath):
    # The extension registers pyptx::launch for AutogradCUDA (no boxed autograd fallback);
    # as in eager mode, a plain kernel's outputs do not track gradients.
    assert torch._C._dispatch_has_kernel_for_dispatch_key("pyptx::launch", "AutogradCUDA")
    k = build_sum_diff()
    a = torch.randn(700, device="cuda", requires_grad=True)
    b = torch.randn(700, device="cuda")
    eager_s, _ = k(a, b)
    op_s, op_d = torch.ops.pyptx.launch([a, b], k.uid, "")
    compiled_s, _ = torch.compile(lambda x, y: k(x, y), fullgraph=True, dynamic=False)(a, b)
    for out in (eager_s, op_s, compiled_s):
        assert not out.requires_grad and out.grad_fn is None
        assert torch.equal(out, a.detach() + b)
    assert torch.equal(op_d, a.detach() - b)


def test_single_output_kernels_use_the_fixed_arity_op_in_cpp(fastpath):
    for n in range(1, 5):
        assert torch._C._dispatch_has_kernel_for_dispatch_key(f"pyptx::launch{n}", "CUDA")
        assert torch._C._dispatch_has_kernel_for_dispatch_key(f"pyptx::launch{n}", "AutogradCUDA")
    k = build_diff()

    @torch.compile(fullgraph=True, dynamic=False)
    def f(a, b):
        return k(a * 2.0, b) + 1.0

    for n in (2048, 2048, 513, 2048):  # a new shape rebinds the plan through the fallback
        a, b = torch.randn(n, device="cuda"), torch.randn(n, device="cuda")
        assert torch.equal(f(a, b), (a * 2.0 - b) + 1.0)
    before = fastpath.fallback_calls()
    for _ in range(5):
        a, b = torch.randn(2048, device="cuda"), torch.randn(2048, device="cuda")
        assert torch.equal(f(a, b), (a * 2.0 - b) + 1.0)
    assert fastpath.fallback_calls() == before  # repeats never leave C++
    a = torch.randn(2048, device="cuda", requires_grad=True)
    out = torch.ops.pyptx.launch2(a, b, k.uid)
    assert not out.requires_grad and out.grad_fn is None and torch.equal(out, a.detach() - b)
    with pytest.raises(SpecError, match="dtype"):
        torch.ops.pyptx.launch2(a.detach(), b.double(), k.uid)


def test_op_errors_keep_their_pyptx_class(fastpath):
    k = build_sum_diff()
    a = torch.randn(64, device="cuda")
    with pytest.raises(SpecError, match="dtype"):
        torch.ops.pyptx.launch([a, a.double()], k.uid, "")


def test_poisoning_sends_calls_to_the_python_path(fastpath):
    import pyptx_torch.eager as eager

    k = build_sum_diff()
    a, b = torch.randn(300, device="cuda"), torch.randn(300, device="cuda")
    check(k, a, b)
    eager.set_poison(True)
    try:
        assert first_fast(k)((a, b)) is None
        check(k, a, b)  # poisoned outputs, all overwritten by the kernel
    finally:
        eager.set_poison(False)
    assert first_fast(k)((a, b)) is not None


def test_status_string(fastpath):
    from pyptx_torch.fastpath import fastpath_status

    assert fastpath_status() == f"active (torch {torch.__version__})"


# ------------------------------------------------ repeats never cross back into Python (item 4)
def test_one_graph_calling_a_kernel_at_two_shapes_stays_in_cpp(fastpath, unpoisoned):
    """Both signatures of one op variant keep a bound C++ plan: after the first call, no call
    reaches the Python implementation (before, each call rebound the other shape's plan)."""
    k = build_diff()

    @torch.compile(fullgraph=True, dynamic=False)
    def f(a, b, c, d):
        return k(a, b) + 1.0, k(c, d) * 2.0

    for _ in range(2):
        f(*randn(2048, 2048, 513, 513))
    assert fastpath.bound_plans(k.uid, "") == 2
    before = fastpath.fallback_calls()
    for _ in range(6):
        a, b, c, d = randn(2048, 2048, 513, 513)
        x, y = f(a, b, c, d)
        assert torch.equal(x, (a - b) + 1.0) and torch.equal(y, (c - d) * 2.0)
    assert fastpath.fallback_calls() == before


def test_graphs_for_two_shapes_called_in_turn_stay_in_cpp(fastpath, unpoisoned):
    """Two graphs (dynamic=False recompiles per shape) of a two-output kernel
    (``pyptx::launch``), called alternately: no call after the first of each goes to Python."""
    k = build_sum_diff()

    @torch.compile(fullgraph=True, dynamic=False)
    def f(a, b):
        s, d = k(a, b)
        return s, d * 3.0

    sizes = (4096, 100)
    for n in sizes * 2:
        f(*randn(n, n))
    assert fastpath.bound_plans(k.uid, "") == 2
    before = fastpath.fallback_calls()
    for step in range(8):
        a, b = randn(sizes[step % 2], sizes[step % 2])
        s, d = f(a, b)
        assert torch.equal(s, a + b) and torch.equal(d, (a - b) * 3.0)
    assert fastpath.fallback_calls() == before


def test_template_kwargs_variants_stay_in_cpp(fastpath, unpoisoned):
    """A compiled fn calling one kernel with two template values: two op variants, each bound."""
    from pyptx_torch.compiled import _kwargs_key

    k = build_diff_t()

    @torch.compile(fullgraph=True, dynamic=False)
    def f(a, b):
        return k(a, b, BLOCK=64) + 1.0, k(b, a, BLOCK=256)

    for _ in range(2):
        f(*randn(3000, 3000))
    for block in (64, 256):
        assert fastpath.bound_plans(k.uid, _kwargs_key({"BLOCK": block})) == 1
    before = fastpath.fallback_calls()
    for _ in range(5):
        a, b = randn(3000, 3000)
        x, y = f(a, b)
        assert torch.equal(x, (a - b) + 1.0) and torch.equal(y, b - a)
    assert fastpath.fallback_calls() == before


def test_a_hash_named_variant_stays_in_cpp(fastpath, unpoisoned):
    """What a torch.export program calls (``sha:<content hash>``): bound on its first call."""
    from pyptx_torch.compiled import hash_variant

    k = build_diff()
    a, b = randn(3000, 3000)
    name = hash_variant(k, (a, b), {})
    assert name.startswith("sha:")
    for _ in range(2):
        assert torch.equal(torch.ops.pyptx.launch2(a, b, name), a - b)
    before = fastpath.fallback_calls()
    for _ in range(5):
        a, b = randn(3000, 3000)
        assert torch.equal(torch.ops.pyptx.launch2(a, b, name), a - b)
    assert fastpath.fallback_calls() == before


def test_many_signatures_keep_the_newest_plans(fastpath, unpoisoned):
    """Past PLANS_PER_VARIANT signatures the oldest plan is dropped (its next call goes to
    Python once and is bound again); the newest ones stay in C++ and every answer is right."""
    k = build_diff()
    cap = fastpath.PLANS_PER_VARIANT
    sizes = [100 + 7 * i for i in range(cap + 2)]
    op = torch.ops.pyptx.launch2
    for n in sizes:
        a, b = randn(n, n)
        assert torch.equal(op(a, b, k.uid), a - b)
    assert fastpath.bound_plans(k.uid, "") == cap
    before = fastpath.fallback_calls()
    for n in sizes[-cap:]:
        a, b = randn(n, n)
        assert torch.equal(op(a, b, k.uid), a - b)
    assert fastpath.fallback_calls() == before
    a, b = randn(sizes[0], sizes[0])  # dropped: back through Python, then bound again
    assert torch.equal(op(a, b, k.uid), a - b)
    assert fastpath.fallback_calls() == before + 1
    assert torch.equal(op(a, b, k.uid), a - b)
    assert fastpath.fallback_calls() == before + 1


def test_repeated_eager_calls_launch_through_cpp_plans(fastpath, unpoisoned, monkeypatch):
    """Eager repeats, alternating shapes, with and without template kwargs: after one call per
    signature nothing is planned again and every launch is a C++ plan's (the Python launch
    path, ``run_plan``, is never reached)."""
    import pyptx_torch.eager as eager

    k = build_diff_t()
    calls = [({}, 2048), ({}, 515), ({"BLOCK": 64}, 2048), ({"BLOCK": 256}, 515)]
    for kw, n in calls:
        a, b = randn(n, n)
        assert torch.equal(k(a, b, **kw), a - b)

    def unexpected(*args, **kwargs):
        raise AssertionError("a repeated eager call left the C++ plans")

    monkeypatch.setattr(eager, "run_plan", unexpected)
    monkeypatch.setattr(eager, "build_plan", unexpected)
    for _ in range(3):
        for kw, n in calls:
            a, b = randn(n, n)
            assert torch.equal(k(a, b, **kw), a - b)
    assert all(isinstance(f, fastpath.Plan) for f in k.launcher("torch").state.fast)
