"""A kernel of a new size reuses its family's traced code (``pyptx_kernels._family``): the
reused specialization equals a fresh trace of that size in everything a launch uses (PTX,
scalar parameters, grid, block, shared memory, tensor shapes and tensor maps), for every
family the library builds with runtime sizes."""

from dataclasses import replace

import pytest
from pyptx_kernels import _family
from pyptx_kernels.flash_attention import decode_host
from pyptx_kernels.flash_attention.decode_config import DecodeConfig
from pyptx_kernels.flash_attention.decode_kernel import DecodeShape, build_decode
from pyptx_kernels.flash_attention.fwd_config import ForwardConfig
from pyptx_kernels.flash_attention.fwd_kernel import build_attention, build_attention_varlen
from pyptx_kernels.fp8_gemm.config import Fp8GemmConfig
from pyptx_kernels.fp8_gemm.kernel import build_fp8_gemm
from pyptx_kernels.gemm.config import GEMM_CONFIGS, GemmConfig
from pyptx_kernels.gemm.kernel import build_gemm
from pyptx_kernels.grouped_gemm.kernel import build_grouped
from pyptx_kernels.rows.config import RowConfig
from pyptx_kernels.rows.layer_norm import build_layer_norm
from pyptx_kernels.rows.rms_norm import build_rms_norm_fast
from pyptx_kernels.rows.softmax import build_softmax_fast
from pyptx_kernels.rows.swiglu import build_swiglu

from pyptx.types import bf16, f32


@pytest.fixture(autouse=True)
def _no_disk_cache(monkeypatch):
    """Fresh traces here are traces: the families' disk cache is off."""
    monkeypatch.setenv("PYPTX_CACHE_DIR", "off")


def _spec(k):
    return getattr(k, "kernel", k).specialize()


def _launch_view(spec):
    return (spec.ptx(), [(n, t.name, v) for n, t, v in spec.scalar_params], spec.grid,
            spec.block, spec.cluster, spec.smem, spec.static_smem, spec.in_shapes,
            spec.out_shapes, spec.tma_maps, spec.name)


def _check_family(build, sizes):
    """``build(size)`` for each size after the first reuses the first one's trace, and equals
    a fresh trace of that size."""
    _family.clear()
    first = _spec(build(sizes[0]))
    for size in sizes[1:]:
        before = _family.stats()["reused"]
        reused = _spec(build(size))
        assert _family.stats()["reused"] == before + 1, f"{size}: traced, not reused"
        assert reused.module is first.module
        _family.clear()
        fresh = _spec(build(size))
        assert fresh.module is not first.module
        assert _launch_view(reused) == _launch_view(fresh), size
        _family.clear()
        _spec(build(sizes[0]))
        first = _spec(build(sizes[0]))


GEMM_PLANS = [GemmConfig()] + [c for c in GEMM_CONFIGS if c.cluster > 1][:1]


@pytest.mark.parametrize("cfg", GEMM_PLANS, ids=lambda c: c.name)
@pytest.mark.parametrize("layout", [("K", "MN"), ("K", "K"), ("MN", "MN")])
def test_gemm_m_and_k_are_runtime(cfg, layout):
    a_major, b_major = layout
    _check_family(lambda mk: build_gemm(mk[0], 2048, mk[1], KB=mk[1] + 8, a_major=a_major,
                                        b_major=b_major, config=cfg),
                  [(1000, 4096), (1001, 4096), (1, 4096), (37, 4000), (8192, 4096)]
                  if a_major == "K" else [(1000, 4096), (8, 4096), (1024, 4000), (8192, 4096)])


def test_gemm_epilogues_share_a_family():
    _check_family(lambda m: build_gemm(m, 1024, 512, bias=True, activation="gelu_tanh",
                                       out_dtype="f32", alpha=0.5),
                  [64, 65, 4000])
    _check_family(lambda m: build_gemm(m, 1024, 512, residual=True), [128, 7, 3000])


@pytest.mark.parametrize("cfg", [ForwardConfig(), ForwardConfig(persistent=True),
                                 ForwardConfig(BN=96, stages=3)], ids=lambda c: c.name)
@pytest.mark.parametrize("causal", [False, True])
def test_attention_forward_sizes_are_runtime(cfg, causal):
    # a persistent kernel's CTA count is in its code: sizes with a full wave of tiles share it
    sizes = ([(2, 1000, 1000), (2, 1001, 1001), (1, 77, 5000), (8, 4096, 4096)]
             if not cfg.persistent else [(2, 1000, 1000), (3, 1001, 2000), (8, 4096, 4096)])
    _check_family(lambda bs: build_attention(bs[0], bs[1], 16, 4, 128, Sk=bs[2], causal=causal,
                                             config=cfg), sizes)


def test_attention_forward_features_and_layouts():
    _check_family(lambda s: build_attention(2, s, 8, 8, 64, window=(256, 0), softcap=30.0,
                                            layouts=("bhsd",) * 3),
                  [1024, 1500, 64])


def test_attention_varlen_total_rows_are_runtime():
    _check_family(lambda t: build_attention_varlen(t, t, 4, 8, 2, 128, 512, causal=True),
                  [1000, 1001, 2048])


def test_grouped_and_fp8_m_is_runtime():
    _check_family(lambda m: build_grouped(m, 512, 256, 4), [1024, 1025, 64, 9000])
    _check_family(lambda m: build_fp8_gemm(m, 1024, 512, config=Fp8GemmConfig()),
                  [128, 129, 4096])


@pytest.mark.parametrize("config", [RowConfig(), RowConfig(ctas=264),
                                    RowConfig(ctas=132, stages=2)], ids=str)
def test_row_counts_are_runtime(config):
    _check_family(lambda b: build_rms_norm_fast(b, 4096, bf16, config=config),
                  [1000, 2000, 5000])


def test_other_row_kernels():
    _check_family(lambda b: build_layer_norm(b, 2048, f32, config=RowConfig()), [64, 640, 6400])
    _check_family(lambda b: build_softmax_fast(b, 1024, bf16, config=RowConfig()), [8, 80, 800])
    _check_family(lambda b: build_swiglu(b, 4096, bf16, config=RowConfig()), [3, 300, 30000])


DECODE_PLANS = [DecodeConfig(), DecodeConfig(mma=False)]


def _decode_shape(B, rows, max_pages, *, paged, append):
    """A decode call's shape: ``rows`` is ``Sk_max``, or paged the page count (64-key
    pages, ``max_pages`` per sequence)."""
    cache = (rows, 64, 2, 128) if paged else (B, rows, 2, 128)
    return DecodeShape(B, 2 if append else 1, 8, 2, 128, cache, max_pages if paged else 0,
                       append, 0)


@pytest.mark.parametrize("config", DECODE_PLANS, ids=["mma", "cuda_core"])
@pytest.mark.parametrize("paged", [False, True], ids=["contiguous", "paged"])
@pytest.mark.parametrize("append", [False, True], ids=["read", "append"])
@pytest.mark.parametrize("split", [False, True], ids=["one_split", "splits"])
def test_decode_sizes_are_runtime(config, paged, append, split):
    # (B, Sk_max or pages, max_pages, splits): one split, or several (one family each)
    sizes = ([(3, 2048, 33, 2), (1, 100, 4, 5), (7, 2048, 4, 2), (3, 100, 33, 5)] if split
             else [(1, 100, 4, 1), (3, 2048, 33, 1), (7, 100, 33, 1)])
    _check_family(lambda s: build_decode(_decode_shape(*s[:3], paged=paged, append=append),
                                         splits=s[3], config=config), sizes)


def _strided(shape, layout):
    """``shape`` with q, the caches and k, v in ``layout``'s memory: ``"bhsd"``, the
    transpose of ``(B, H, S, D)`` tensors; ``"padded"``, that with 3 more rows and 8 more
    columns per row."""
    pad = (3, 8) if layout == "padded" else (0, 0)

    def strides(dims):
        d0, d1, d2, D = dims
        rows, cols = d1 + pad[0], D + pad[1]
        return (d2 * rows * cols, cols, rows * cols, 1)
    names = ("Q", "KC", "VC", "KN", "VN") if shape.append else ("Q", "KC", "VC")
    return replace(shape, strides=tuple((n, strides(shape.dims(n))) for n in names))


@pytest.mark.parametrize("config", DECODE_PLANS, ids=["mma", "cuda_core"])
@pytest.mark.parametrize("paged", [False, True], ids=["contiguous", "paged"])
@pytest.mark.parametrize("append", [False, True], ids=["read", "append"])
def test_decode_strides_are_runtime(config, paged, append):
    """Dense, (B, H, S, D)-transposed and padded memory (strides and the flat tensors of
    ``DecodeShape.span``) at two cache lengths: one trace, the strides in the scalars and
    the tensor maps."""
    sizes = [(3, 2048, 33, None), (1, 100, 4, "bhsd"), (3, 2048, 33, "padded"),
             (1, 100, 4, "padded")]

    def build(s):
        shape = _decode_shape(*s[:3], paged=paged, append=append)
        return build_decode(shape if s[3] is None else _strided(shape, s[3]), config=config)
    _check_family(build, sizes)
    shape = _strided(_decode_shape(1, 100, 4, paged=paged, append=append), "padded")
    spec = _spec(build_decode(shape, config=config))
    assert spec.in_shapes[1] == (shape.span("KC"),)
    for _, tp in spec.tma_maps:
        st = shape.strides_of("KC")
        assert tp.global_strides == (st[2] * 2, st[1] * 2, st[0] * 2)


@pytest.mark.parametrize("config", DECODE_PLANS, ids=["mma", "cuda_core"])
def test_decode_partials_sizes_are_runtime(config):
    _check_family(lambda s: build_decode(_decode_shape(*s[:3], paged=True, append=False),
                                         splits=s[3], config=config, combine=False),
                  [(3, 300, 33, 2), (7, 100, 4, 5)])


def test_a_new_decode_size_does_not_trace():
    """The host's kernel of a new batch, cache length, table width and split count reuses
    the family's trace (each size is still its own cache entry: a repeated call is a hit)."""
    _family.clear()
    decode_host.decode_kernel.cache_clear()
    opts = ("bf16", True, (-1, -1), 0.0, 128 ** -0.5, DecodeConfig())
    first, s1 = decode_host.decode_kernel(_decode_shape(1, 8192, 128, paged=True,
                                                        append=False), *opts)
    before = _family.stats()
    other, s2 = decode_host.decode_kernel(_decode_shape(5, 900, 130, paged=True,
                                                        append=False), *opts)
    after = _family.stats()
    assert s1 > 1 and s2 > 1 and s1 != s2, (s1, s2)
    assert (after["traced"], after["reused"]) == (before["traced"], before["reused"] + 1)
    assert _spec(other).module is _spec(first).module
    assert decode_host.decode_kernel(_decode_shape(5, 900, 130, paged=True, append=False),
                                     *opts)[0] is other


def test_a_new_process_reads_the_family_from_disk(monkeypatch, tmp_path):
    monkeypatch.setenv("PYPTX_CACHE_DIR", str(tmp_path))
    _family.clear()
    build_gemm(1000, 2048, 4096)                     # traced, written
    assert len(list(tmp_path.glob("*.family.json"))) == 1
    _family.clear()                                  # as a new process
    before = _family.stats()
    loaded = _spec(build_gemm(777, 2048, 4096))
    after = _family.stats()
    assert (after["loaded"], after["traced"]) == (before["loaded"] + 1, before["traced"])
    monkeypatch.setenv("PYPTX_CACHE_DIR", "off")
    _family.clear()
    fresh = _spec(build_gemm(777, 2048, 4096))
    assert _launch_view(loaded) == _launch_view(fresh)
    assert loaded.ptx(True) == fresh.ptx(True)
    assert list(loaded.emit()[1]) == list(fresh.emit()[1])


def test_a_damaged_family_file_is_traced_again(monkeypatch, tmp_path):
    monkeypatch.setenv("PYPTX_CACHE_DIR", str(tmp_path))
    _family.clear()
    build_gemm(1000, 1024, 512)
    (path,) = tmp_path.glob("*.family.json")
    path.write_text("{not json")
    _family.clear()
    before = _family.stats()["traced"]
    spec = _spec(build_gemm(64, 1024, 512))
    assert _family.stats()["traced"] == before + 1 and "ld.param" in spec.ptx()
    text = path.read_text()
    assert text.startswith("{") and '"entry"' in text   # replaced by the new trace
