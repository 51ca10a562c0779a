"""The eager fast path of ``attention_with_kvcache`` (a repeated call's key finds its checked
plan: no checks, no planning, the stream's zeroed counters) on CPU tensors that pass for
CUDA ones, each decode kernel's torch launch replaced by a recorder: a repeated call, and
the custom ops' implementation, launch the same kernel (so the same PTX, grid and block) on
the same tensors and counters as the checked reference route (``check_call`` +
``decode_host.decode``, the launcher the JAX path and the benchmarks use), for contiguous
and paged caches, with and without appended k/v, ragged lengths, B 1/16/64, causal or not,
windows, softcap, fixed splits, (B, H, S, D)-transposed caches and strided q and k (read in
place: the kernel gets the flat view of their memory); counters are fresh zeros while a CUDA
graph is captured and per stream otherwise; every bad input still raises at the caller's
line after the call was cached."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from pyptx_kernels import _common  # noqa: E402
from pyptx_kernels.flash_attention import decode_api, decode_host  # noqa: E402
from pyptx_kernels.flash_attention.decode_config import DecodeConfig  # noqa: E402

from pyptx.errors import ConfigError  # noqa: E402

HQ, HKV, D = 32, 8, 128
BF, I32 = torch.bfloat16, torch.int32


class Env:
    """The recorded launches ``(kernel, args, outs)`` and the stubbed CUDA stream state."""

    def __init__(self):
        self.log = []
        self.stream = 0
        self.capturing = False


@pytest.fixture
def env(monkeypatch):
    e = Env()
    outs_of = {}

    def launch(kernel, args, kwargs):
        assert not kwargs
        for a, spec in zip(args, kernel._in_specs, strict=True):
            assert type(a) is torch.Tensor and a.is_contiguous()
            assert tuple(a.shape) == tuple(spec.dims), (kernel.name, a.shape, spec.dims)
        outs = outs_of.get(kernel)
        if outs is None:
            dt = {"bf16": BF, "f16": torch.float16, "f32": torch.float32}
            outs = outs_of[kernel] = tuple(torch.empty(tuple(s.dims), dtype=dt[s.dtype.name])
                                           for s in kernel._out_specs)
        e.log.append((kernel, args, outs))
        return outs

    real = decode_host.decode_kernel

    def decode_kernel(*a, **kw):
        k, splits = real(*a, **kw)
        monkeypatch.setitem(k._launchers, torch.Tensor, launch)
        return k, splits

    class Stream:
        @property
        def cuda_stream(self):
            return e.stream

    monkeypatch.setattr(decode_host, "decode_kernel", decode_kernel)
    monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda self: True))
    monkeypatch.setattr(_common, "EAGER_DEVICES", ("cuda", "cpu"))
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: e.capturing)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: Stream())
    monkeypatch.setattr(torch._C, "_cuda_getCurrentRawStream", lambda index: e.stream,
                        raising=False)
    monkeypatch.setattr(torch._C, "_cuda_isCurrentStreamCapturing", lambda: e.capturing,
                        raising=False)
    check = _common.check_devices

    def check_devices(who, *xs):   # the real check; its slow path refuses CPU tensors
        try:
            return check(who, *xs)
        except ConfigError:
            if all(x.device.type == "cpu" for x in xs if isinstance(x, torch.Tensor)):
                return None
            raise

    monkeypatch.setattr(_common, "check_devices", check_devices)
    monkeypatch.setattr(decode_api, "_EAGER", {})
    monkeypatch.setattr(_common, "_ZEROED", {})
    decode_api._runner.cache_clear()     # runners hold kernels and their streams' counters
    yield e
    decode_api._runner.cache_clear()


def _inputs(B, Sk, *, paged=False, append=False, ragged=False, Sq=1, seed=0, bhsd=False):
    """A call's arguments; ``bhsd``: the caches are transposed ``(B, H, S, D)`` tensors."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, Sq, HQ, D, generator=g).to(BF)
    kw = {}
    if paged:
        page = 64
        mp = Sk // page
        cache = (B * mp, page, HKV, D)
        kw["block_table"] = torch.randperm(B * mp, generator=g).reshape(B, mp).to(I32)
    else:
        cache = (B, Sk, HKV, D)

    def rnd():
        if bhsd:
            return torch.randn(cache[0], HKV, cache[1], D, generator=g).to(BF).transpose(1, 2)
        return torch.randn(cache, generator=g).to(BF)
    kc, vc = rnd(), rnd()
    cap = Sk - (Sq if append else 0)
    lens = (torch.randint(0, cap + 1, (B,), generator=g) if ragged
            else torch.full((B,), cap)).to(I32)
    if append:
        kw["k"] = torch.randn(B, Sq, HKV, D, generator=g).to(BF)
        kw["v"] = torch.randn(B, Sq, HKV, D, generator=g).to(BF)
    return (q, kc, vc, lens), kw


def _reference(env, args, kw, opts):
    """The launch of the checked route: ``check_call``, ``_options`` and
    ``decode_host.decode`` (``decode_host.launcher``, ``zeroed_counters``)."""
    q, kc, vc, lens = args
    k, v, table = kw.get("k"), kw.get("v"), kw.get("block_table")
    shape, dtype = decode_api.check_call(q, kc, vc, lens, k, v, table)
    causal, window, softcap, scale, splits = decode_api._options(
        opts.get("causal", True), opts.get("window", (-1, -1)), opts.get("softcap", 0.0),
        opts.get("scale"), shape.D, opts.get("num_splits", 0))
    arrays = [q, kc, vc, lens.contiguous()] + ([table] if table is not None else []) \
        + ([k, v] if k is not None else [])
    n = len(env.log)
    decode_host.decode(shape, arrays, dtype=dtype, causal=causal, window=window,
                       softcap=softcap, scale=scale, config=DecodeConfig(num_splits=splits),
                       num_sms=decode_host.device_sms(q))
    assert len(env.log) == n + 1
    return env.log[-1]


def _same_launch(got, want):
    (k1, a1, _), (k2, a2, _) = got, want
    assert k1 is k2, (k1.name, k2.name)      # one kernel object: the same PTX, grid, block
    assert (k1.name, k1._grid, k1._block) == (k2.name, k2._grid, k2._block)
    assert len(a1) == len(a2) == len(k1._in_specs)
    for x, y in zip(a1, a2):
        assert x.shape == y.shape and x.dtype == y.dtype and x.stride() == y.stride()
        assert x.data_ptr() == y.data_ptr() or torch.equal(x, y)
    names = [n for n in k1.arg_names[:len(a1)]]
    if "CNT" in names:
        cnt = a1[names.index("CNT")]
        assert cnt is a2[names.index("CNT")], "the stream's zeroed counters"
        assert not cnt.any()


def _fail_checks(monkeypatch):
    def refuse(*a, **kw):
        raise AssertionError("a cached call ran the checks")
    monkeypatch.setattr(decode_api, "check_call", refuse)


CASES = [
    (1, 4096, dict(), dict()),
    (1, 32768, dict(paged=True, ragged=True), dict()),
    (16, 1024, dict(), dict()),
    (16, 1024, dict(paged=True), dict()),
    (16, 1024, dict(append=True, ragged=True), dict()),
    (16, 1024, dict(paged=True, append=True, ragged=True), dict(causal=False)),
    (64, 1024, dict(ragged=True), dict(causal=False)),
    (64, 512, dict(paged=True, append=True), dict()),
    (16, 2048, dict(Sq=4, append=True), dict(causal=False, num_splits=3)),
    (1, 4096, dict(paged=True), dict(window=(256, -1), softcap=30.0, scale=0.1)),
    (4, 1024, dict(bhsd=True), dict()),
    (4, 1024, dict(bhsd=True, paged=True, append=True, ragged=True), dict()),
]


@pytest.mark.parametrize("B,Sk,inp,opts", CASES)
def test_repeated_call_launches_what_the_checked_route_launches(env, monkeypatch, B, Sk, inp,
                                                                opts):
    args, kw = _inputs(B, Sk, **inp)
    first = decode_api.attention_with_kvcache(*args, **kw, **opts, return_softmax_lse=True)
    assert len(decode_api._EAGER) == 1
    want = _reference(env, args, kw, opts)
    _same_launch(env.log[0], want)
    # the custom ops' implementation (torch.compile's and the dispatcher's route)
    q, kc, vc, lens = args
    causal, window, softcap, scale, splits = decode_api._options(
        opts.get("causal", True), opts.get("window", (-1, -1)), opts.get("softcap", 0.0),
        opts.get("scale"), D, opts.get("num_splits", 0))
    decode_api._run_torch(q, kc, vc, lens, kw.get("k"), kw.get("v"), kw.get("block_table"),
                          causal, *window, softcap, scale, splits)
    _same_launch(env.log[-1], want)
    real_check = decode_api.check_call
    _fail_checks(monkeypatch)
    for _ in range(2):
        out, lse = decode_api.attention_with_kvcache(*args, **kw, **opts,
                                                     return_softmax_lse=True)
        _same_launch(env.log[-1], want)
        outs = env.log[-1][2]
        assert out is outs[0] and lse is outs[1]
        assert out.shape == first[0].shape and lse.shape == first[1].shape
    monkeypatch.setattr(decode_api, "check_call", real_check)
    # new lengths (values) in a new tensor of the same shape: the same plan
    lens = args[3].flip(0).clone()
    _fail_checks(monkeypatch)
    decode_api.attention_with_kvcache(*args[:3], lens, **kw, **opts)
    assert env.log[-1][1][3] is lens
    assert len(decode_api._EAGER) == 1


def test_strided_q_k_and_caches_are_read_in_place(env):
    """Strided q, k and (B, H, S, D)-transposed caches reach the kernel as the flat views of
    their memory (no copy), the dense v as it is; one cached call per stride set."""
    args, kw = _inputs(16, 1024, append=True, Sq=4, bhsd=True)
    q = args[0].transpose(1, 2).contiguous().transpose(1, 2)     # (B, Sq, Hq, D) view
    k = kw["k"].transpose(1, 2).contiguous().transpose(1, 2)
    args, kw = (q, *args[1:]), dict(kw, k=k)
    assert not q.is_contiguous() and not k.is_contiguous() and kw["v"].is_contiguous()
    for _ in range(3):
        decode_api.attention_with_kvcache(*args, **kw, causal=False)
        _same_launch(env.log[-1], _reference(env, args, kw, dict(causal=False)))
    assert len(decode_api._EAGER) == 1
    launched = env.log[-1][1]
    for got, x in zip(launched, (q, args[1], args[2])):
        assert got.dim() == 1 and got.data_ptr() == x.data_ptr()
        assert got.numel() == 1 + sum((n - 1) * st for n, st in zip(x.shape, x.stride()))
    assert launched[4].dim() == 1 and launched[4].data_ptr() == k.data_ptr()
    assert launched[5] is kw["v"]
    decode_api.attention_with_kvcache(*args, **dict(kw, v=kw["v"].transpose(1, 2)
                                                    .contiguous().transpose(1, 2)))
    assert len(decode_api._EAGER) == 2


def test_counters_per_stream_and_fresh_under_capture(env):
    args, kw = _inputs(1, 32768, paged=True)
    decode_api.attention_with_kvcache(*args, **kw)
    names = env.log[-1][0].arg_names
    at = names.index("CNT")
    c0 = env.log[-1][1][at]
    env.stream = 7
    decode_api.attention_with_kvcache(*args, **kw)
    c7 = env.log[-1][1][at]
    assert c7 is not c0 and c7 is _common.zeroed_words(args[0], c7.numel())
    env.stream = 0
    decode_api.attention_with_kvcache(*args, **kw)
    assert env.log[-1][1][at] is c0
    env.capturing = True
    for _ in range(2):
        decode_api.attention_with_kvcache(*args, **kw)
        c = env.log[-1][1][at]
        assert c is not c0 and c is not c7 and not c.any() and c.dtype == I32


def test_options_of_other_types_are_checked_again(env):
    """A cached call's options with another type are not the cached call: ``causal=1``,
    ``window=(-1.0, -1)`` and a bad num_splits still raise at this line; a list window
    takes the tuple's plan."""
    args, kw = _inputs(16, 1024, paged=True)
    f = decode_api.attention_with_kvcache
    f(*args, **kw)
    f(*args, **kw, window=(-1, -1))
    n = len(decode_api._EAGER)
    f(*args, **kw, window=[-1, -1])
    assert len(env.log) == 3
    here = r"test_decode_fast_path_cpu\.py:\d+: attention_with_kvcache: "
    bad = [
        (dict(causal=1), "causal must be a bool"),
        (dict(window=(-1.0, -1)), r"window\[0\] must be an int"),
        (dict(window=(-1,)), "window must be a pair"),
        (dict(window=-1), "window must be a pair"),
        (dict(num_splits=True), "num_splits must be"),
        (dict(softcap=float("nan")), "softcap must be"),
    ]
    for opts, msg in bad:
        with pytest.raises(ConfigError, match=here + msg):
            f(*args, **kw, **opts)
    assert len(decode_api._EAGER) <= n + 1
    q, kc, vc, lens = args
    tab = kw["block_table"]
    calls = [
        (lambda: f(q, kc, vc, lens.long(), block_table=tab), "cache_seqlens must be int32"),
        (lambda: f(q, kc, vc, lens, block_table=tab.long()), "block_table must be int32"),
        (lambda: f(q, kc, vc[:-1], lens, block_table=tab), "one 4-D shape"),
        (lambda: f(q.float(), kc, vc, lens, block_table=tab), "share one dtype"),
        (lambda: f(q, kc, vc, [1] * 16, block_table=tab), "torch tensor or a JAX array"),
        (lambda: f(q, kc, vc, lens, block_table=tab, k=q), "both k and v"),
        (lambda: f(q, kc.as_strided(kc.shape, (*kc.stride()[:2], 64, 1)), vc, lens,
                   block_table=tab), "no two elements at one address"),
        (lambda: f(q, kc[:, :40], vc[:, :40], lens, block_table=tab), "page sizes"),
        (lambda: f(q, kc, vc, lens), "contiguous cache"),
    ]
    for call, msg in calls:
        with pytest.raises(ConfigError, match=here + ".*" + msg):
            call()
    f(*args, **kw)   # and the cached call still runs
    assert len(env.log) == 4


def test_bad_strides_still_refused_after_a_cached_call(env):
    args, kw = _inputs(16, 1024)
    f = decode_api.attention_with_kvcache
    f(*args, **kw)
    q, kc, vc, lens = args
    kt = torch.zeros(16, 1024, HKV, D + 4, dtype=BF)[..., :D]
    with pytest.raises(ConfigError, match=r"test_decode_fast_path_cpu\.py:\d+: .*multiples "
                                          r"of 8 elements"):
        f(q, kt, kt, lens)
