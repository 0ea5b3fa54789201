"""confidence, confidence_from_logits and draft_margin: C++ CPU kernels against the float64 reference."""
import itertools

import pytest
import torch

import adaptive_verify as av
from adaptive_verify import reference as ref

DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def _tolerance(args, kwargs):
    """8x the error of a same-precision (fp32) torch computation against float64, plus a floor: the
    kernel's accumulation order differs from torch's, not its precision."""
    want = ref.confidence(*args, **kwargs)
    fp32 = ref.confidence(*args, **kwargs, dtype=torch.float32).double()
    return want, 8 * (fp32 - want).abs().max().item() + 2e-6


def _inputs(R, K, H, Q, dtype, g, strided):
    if strided:  # rows of a bigger buffer: non-trivial strides on R and K, last dim contiguous
        big = torch.randn(R, 2 * K + 1, H + 5, generator=g).to(dtype)
        hidden = big[:, 1::2, 3:3 + H]
    else:
        hidden = torch.randn(R, K, H, generator=g).to(dtype)
    markov = torch.randn(R, K, Q, generator=g).to(dtype) if Q else None
    weight = torch.randn(H + Q, generator=g) / (H + Q) ** 0.5
    temperature = torch.rand(K, generator=g) * 1.5 + 0.25
    return hidden, weight, markov, temperature


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("H,Q", [(64, 0), (769, 256), (4096, 0), (7168, 256)])
def test_confidence_matches_reference(dtype, H, Q):
    g = torch.Generator().manual_seed(H + Q)
    for K, strided in [(1, False), (7, True), (16, False)]:
        R = 5 if H > 1000 else 13
        hidden, weight, markov, temperature = _inputs(R, K, H, Q, dtype, g, strided)
        assert hidden.is_contiguous() != strided
        for survival, temp, bias in itertools.product((False, True), (None, temperature), (None, 0.37)):
            kwargs = dict(bias=bias, markov=markov, temperature=temp, survival=survival)
            got = av.confidence(hidden, weight, **kwargs)
            want, tol = _tolerance((hidden, weight), kwargs)
            assert got.dtype == torch.float32 and got.shape == (R, K)
            err = (got.double() - want).abs().max().item()
            assert err <= tol, f"K={K} {kwargs.keys()} err {err} > tol {tol}"


def test_survival_is_the_left_to_right_product():
    g = torch.Generator().manual_seed(1)
    hidden, weight, markov, temperature = _inputs(9, 11, 300, 20, torch.bfloat16, g, True)
    conf = av.confidence(hidden, weight, markov=markov, temperature=temperature)
    surv = av.confidence(hidden, weight, markov=markov, temperature=temperature, survival=True)
    a = torch.ones(9)
    for j in range(11):
        a = a * conf[:, j]
        assert torch.equal(surv[:, j], a)


def test_bias_tensor_equals_bias_float_and_out_is_written():
    g = torch.Generator().manual_seed(2)
    hidden, weight, _, _ = _inputs(4, 3, 128, 0, torch.float32, g, False)
    out = torch.full((4, 3), 12345.0)
    a = av.confidence(hidden, weight, bias=torch.tensor(-0.25), out=out)
    assert a.data_ptr() == out.data_ptr()
    assert torch.equal(a, av.confidence(hidden, weight, bias=-0.25))
    assert not torch.equal(a, av.confidence(hidden, weight))


@pytest.mark.parametrize("dtype", DTYPES)
def test_confidence_from_logits_matches_reference(dtype):
    g = torch.Generator().manual_seed(3)
    big = (torch.randn(17, 40, generator=g) * 3).to(dtype)
    logits = big[:, 5:21]  # strided rows
    temperature = torch.rand(16, generator=g) + 0.3
    for temp, survival in itertools.product((None, temperature), (False, True)):
        got = av.confidence_from_logits(logits, temp, survival=survival)
        want = ref.confidence_from_logits(logits, temp, survival=survival)
        assert (got.double() - want).abs().max().item() < 1e-6


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("V", [1, 2, 7, 1000, 32003])
def test_draft_margin_matches_reference(dtype, V):
    g = torch.Generator().manual_seed(V)
    x = (torch.randn(3, 5, V, generator=g) * 4).to(dtype)
    if V > 2:
        x[0, 0, 1] = x[0, 0].max()  # a tie at the top: margin 0
    got = av.draft_margin(x)
    want = ref.draft_margin(x)
    assert torch.equal(got, want)
    if V > 2:
        assert got[0, 0].item() == 0.0
    if V == 1:
        assert torch.isinf(got).all()


def test_draft_margin_ignores_and_counts_nan():
    av.reset_error_counts("cpu")
    x = torch.randn(2, 3, 50)
    x[1, 2, 7] = float("nan")
    x[0, 0, :] = float("nan")
    got = av.draft_margin(x)
    assert torch.isnan(got[0, 0])
    clean = x[1, 2].clone()
    clean[7] = float("-inf")
    top = torch.topk(clean, 2).values
    assert got[1, 2].item() == (top[0] - top[1]).item()
    assert av.error_counts("cpu")["nan_logits"] == 51


def test_bad_inputs_name_the_argument():
    h = torch.randn(2, 3, 8)
    w = torch.randn(8)
    with pytest.raises(TypeError, match="hidden"):
        av.confidence(h.int(), w)
    with pytest.raises(ValueError, match="hidden"):
        av.confidence(torch.randn(2, 8), w)
    with pytest.raises(ValueError, match="hidden"):
        av.confidence(torch.randn(2, 3, 8).transpose(1, 2), torch.randn(3))
    with pytest.raises(ValueError, match="K"):
        av.confidence(torch.randn(2, 33, 8), w)
    with pytest.raises(ValueError, match="weight"):
        av.confidence(h, torch.randn(9))
    with pytest.raises(TypeError, match="markov"):
        av.confidence(h, torch.randn(12), markov=torch.randn(2, 3, 4).half())
    with pytest.raises(ValueError, match="markov"):
        av.confidence(h, torch.randn(12), markov=torch.randn(2, 4, 4))
    with pytest.raises(ValueError, match="bias"):
        av.confidence(h, w, bias=torch.randn(2))
    for bad in ([1.0, 0.0, 1.0], [1.0, -2.0, 1.0], [1.0, float("nan"), 1.0], [float("inf")] * 3):
        with pytest.raises(ValueError, match="temperature"):
            av.confidence(h, w, temperature=torch.tensor(bad))
        with pytest.raises(ValueError, match="temperature"):
            av.confidence_from_logits(torch.randn(2, 3), bad)
    with pytest.raises(ValueError, match="temperature"):
        av.confidence(h, w, temperature=torch.ones(4))
    with pytest.raises(ValueError, match="out"):
        av.confidence(h, w, out=torch.empty(3, 3))
    with pytest.raises(TypeError, match="logits"):
        av.confidence_from_logits(torch.randn(2, 3).double())
    with pytest.raises(ValueError, match="draft_logits"):
        av.draft_margin(torch.randn(2, 3))
    with pytest.raises(ValueError, match="draft_logits"):
        av.draft_margin(torch.randn(2, 3, 0))


@pytest.mark.parametrize("bias", [1e308, -1e308, 3.5e38, float("nan"), float("inf"), 10**400])
def test_a_float_bias_must_be_finite_in_float32(bias):
    """Issue 16, finding 8: bias=1e308 is finite but reached the kernel's float32 field as inf (NaN confidences
    where the reference gives 0 or 1); NaN and inf were accepted, 10**400 raised OverflowError."""
    h, w = torch.randn(2, 3, 8), torch.randn(8)
    with pytest.raises(ValueError, match="^bias must be finite"):
        av.confidence(h, w, bias=bias)
    got = av.confidence(h, w, bias=3.4e38)  # the largest float32 range still works, saturating the sigmoid
    assert torch.equal(got, ref.confidence(h, w, bias=3.4e38).float())


@pytest.mark.parametrize("temperature", ["123", b"12", [1.0, "x", 1.0], [10**400] * 3, [[1.0]] * 3])
def test_a_temperature_that_is_not_numbers_is_a_type_error(temperature):
    """Found by fuzzing: a str temperature was iterated character by character (ValueError naming nothing)."""
    with pytest.raises(TypeError, match="^temperature must be"):
        av.confidence_from_logits(torch.randn(2, 3), temperature)


def test_sequence_temperature_is_accepted():
    h = torch.randn(2, 3, 8)
    w = torch.randn(8)
    assert torch.equal(av.confidence(h, w, temperature=[0.5, 1.0, 2.0]),
                       av.confidence(h, w, temperature=torch.tensor([0.5, 1.0, 2.0])))


def test_custom_ops_pass_opcheck():
    g = torch.Generator().manual_seed(4)
    hidden, weight, markov, temperature = _inputs(3, 4, 40, 8, torch.bfloat16, g, True)
    out = torch.empty(3, 4)
    torch.library.opcheck(torch.ops.adaptive_verify.confidence_into.default,
                          (hidden, weight, torch.tensor(0.1), markov, temperature, out, 0.0, True))
    torch.library.opcheck(torch.ops.adaptive_verify.confidence_from_logits_into.default,
                          (torch.randn(3, 4), temperature, out, False))
    err = torch.zeros(16, dtype=torch.int32)
    torch.library.opcheck(torch.ops.adaptive_verify.draft_margin_into.default, (torch.randn(3, 4, 50), out, err))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_every_16_bit_value_converts_exactly(dtype):
    """All 65536 bit patterns (subnormals, infinities, NaNs included) through the CPU kernel's conversion:
    with H = 1 the logit is value * weight, and two exact power-of-two weights keep both tiny and huge
    values away from sigmoid's flat ends."""
    values = torch.arange(-(2**15), 2**15, dtype=torch.int32).to(torch.int16).view(dtype)  # every pattern
    hidden = values.reshape(-1, 8, 1)
    exact = values.double().reshape(-1, 8)
    for scale in (2.0**-16, 2.0**14):
        got = av.confidence(hidden, torch.tensor([scale]))
        want = torch.sigmoid(exact * scale)
        same_nan = torch.isnan(got) == torch.isnan(want)
        assert bool(same_nan.all())
        err = (got.double() - want).abs().nan_to_num(0.0)
        assert err.max().item() < 1e-6, f"scale {scale}: worst value {values.reshape(-1, 8)[err == err.max()][:3]}"


def test_device_mismatches_name_the_argument():
    """Without a GPU, the meta device stands in for "another device"."""
    h = torch.randn(2, 3, 8)
    w = torch.randn(8)
    with pytest.raises(ValueError, match="hidden"):
        av.confidence(h.to("meta"), w.to("meta"))
    with pytest.raises(ValueError, match="weight"):
        av.confidence(h, w.to("meta"))
    with pytest.raises(ValueError, match="markov"):
        av.confidence(h, torch.randn(12), markov=torch.randn(2, 3, 4, device="meta"))
    with pytest.raises(ValueError, match="bias"):
        av.confidence(h, w, bias=torch.tensor(0.5, device="meta"))
    with pytest.raises(ValueError, match="temperature"):
        av.confidence(h, w, temperature=torch.ones(3, device="meta"))
    with pytest.raises(ValueError, match="out"):
        av.confidence(h, w, out=torch.empty(2, 3, device="meta"))
    with pytest.raises(ValueError, match="conf"):
        av.AcceptanceStats(3).update(torch.rand(2, 3, device="meta"), torch.zeros(2, dtype=torch.int32),
                                     torch.zeros(2, dtype=torch.int32))


def test_temperatures_made_under_inference_mode():
    """Engines build their tensors under torch.inference_mode, where tensors have no version counter: the
    temperature check must not need one (it crashed), and a CPU one is still checked every call."""
    with torch.inference_mode():
        hidden, weight, temperature = torch.randn(3, 4, 8), torch.randn(8), torch.full((4,), 2.0)
    want = av.confidence(hidden, weight, temperature=temperature.clone())
    assert torch.equal(av.confidence(hidden, weight, temperature=temperature), want)
    logits = torch.randn(3, 4)
    av.confidence_from_logits(logits, temperature)
    with torch.inference_mode():
        temperature[1] = -1.0
    with pytest.raises(ValueError, match="temperature"):
        av.confidence(hidden, weight, temperature=temperature)


def test_an_unhashable_bias_with_out_is_named_not_a_cache_error():
    """Found by the fuzzer (issue 16): with out= the remembered-call lookup hashed bias first, so bias=[1.0] raised
    "unhashable type: 'list'" instead of the TypeError naming bias."""
    hidden, weight = torch.randn(2, 3, 4), torch.randn(4)
    with pytest.raises(TypeError, match="^bias"):
        av.confidence(hidden, weight, bias=[1.0], out=torch.empty(2, 3))


def test_a_temperature_not_finite_and_positive_gives_nan_confidences_the_planner_counts(monkeypatch):
    """The kernels' rule for temperatures the host does not read (a CUDA tensor's, confidence/math.h): a position
    whose temperature is 0, negative, +inf or NaN gets a NaN confidence (never a silently flipped or saturated one),
    which prefix_survival counts and never lets survive. Run on the C++ CPU kernel, which shares math.h with the
    CUDA kernels, with the host's CPU check bypassed; without the bypass the CPU call is a ValueError naming it."""
    import importlib

    confidence_module = importlib.import_module("adaptive_verify.confidence")  # (the package's name is the op)
    R, K, H = 3, 5, 8
    g = torch.Generator().manual_seed(4)
    hidden, weight = torch.randn(R, K, H, generator=g), torch.randn(H, generator=g)
    temperature = torch.tensor([1.5, 0.0, -2.0, float("inf"), float("nan")])
    with pytest.raises(ValueError, match="temperature"):
        av.confidence(hidden, weight, temperature=temperature)
    monkeypatch.setattr(confidence_module, "check_temperature", lambda name, t, K, device: t)
    for conf in (av.confidence(hidden, weight, temperature=temperature),
                 av.confidence_from_logits(torch.randn(R, K, generator=g), temperature)):
        assert torch.isfinite(conf[:, 0]).all() and torch.isnan(conf[:, 1:]).all()
    conf = av.confidence(hidden, weight, temperature=temperature)
    want = ref.confidence(hidden, weight, temperature=torch.tensor([1.5, 1.0, 1.0, 1.0, 1.0]))
    torch.testing.assert_close(conf[:, 0], want[:, 0].float(), atol=1e-5, rtol=1e-5)
    av.reset_error_counts("cpu")
    survival = av.prefix_survival(conf, torch.full((R,), K, dtype=torch.int32))
    assert (survival[:, 1:] == 0).all() and av.error_counts("cpu")["nan_survival"] > 0
    av.reset_error_counts("cpu")
