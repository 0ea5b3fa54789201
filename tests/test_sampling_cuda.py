"""Sampler CUDA kernels == C++ CPU kernels on the same seeds, and inside a captured CUDA graph with the
offset in a device tensor, for both CUDA kernels (v1, the default, and the candidate "splitv", chosen by the
module setting sampling.CUDA_KERNEL). The CUDA tests skip without a GPU; the kernel-name validation runs on
the CPU."""
import pytest
import torch

import adaptive_verify as av
from adaptive_verify import sampling as sampling_module

cuda_test = pytest.mark.cuda


@pytest.fixture(params=["v1", "splitv"])
def kernel(request, monkeypatch):
    monkeypatch.setattr(sampling_module, "CUDA_KERNEL", request.param)
    return request.param


def _batch(R, K, V, dtype, seed, probs):
    g = torch.Generator().manual_seed(seed)
    q_len = torch.randint(0, K + 2, (R,), generator=g)  # 0 = padding row
    qsl = torch.zeros(R + 1, dtype=torch.int32)
    qsl[1:] = torch.cumsum(q_len, 0).to(torch.int32)
    T = int(qsl[-1]) + 3
    logits = (torch.randn(T, V, generator=g) * 3).to(dtype)
    drafts = torch.randint(-1, V + 1, (R, K), generator=g, dtype=torch.int32)  # includes invalid ids
    q = torch.softmax(torch.randn(R, K, V, generator=g), -1) if probs else None
    temperature = torch.where(torch.rand(R, generator=g) < 0.3, torch.zeros(R), torch.rand(R, generator=g) * 2 + 0.1)
    seeds = torch.randint(0, 2**62, (R,), generator=g, dtype=torch.int64)
    return logits, qsl, drafts, q, temperature, seeds


def _cuda(kw):
    return {k: (v.cuda() if isinstance(v, torch.Tensor) else v) for k, v in kw.items()}


def _check_same(logits, qsl, drafts, **kw):
    """CUDA == CPU on outputs and on every error counter."""
    av.reset_error_counts("cpu")
    av.reset_error_counts("cuda")
    cpu = av.rejection_sample(logits, qsl, drafts, **kw)
    gpu = av.rejection_sample(logits.cuda(), qsl.cuda(), drafts.cuda(), **_cuda(kw))
    assert torch.equal(cpu[0], gpu[0].cpu()) and torch.equal(cpu[1], gpu[1].cpu())
    assert av.error_counts("cpu") == av.error_counts("cuda")


@cuda_test
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("V", [1, 7, 1000, 32003, 151936])
@pytest.mark.parametrize("probs", [False, True])
def test_rejection_sample_cuda_matches_cpu(kernel, dtype, V, probs):
    R, K = (64, 7) if V < 100000 else (8, 3)
    logits, qsl, drafts, q, temperature, seeds = _batch(R, K, V, dtype, V + probs, probs)
    _check_same(logits, qsl, drafts, draft_probs=q, temperature=temperature, seeds=seeds, offset=12345)


def ties_and_nans_case(dtype):
    """Few distinct values (ties across chunks: smallest id wins), NaN and -inf entries, a row of -inf, a row of
    NaN, misaligned rows (V odd), one request spread over many chunks; drafts mostly the row's argmax, so
    the chain runs through several rows, and one out of range (rejected and counted).
    Returns (logits, qsl, drafts, R)."""
    R, K, V = 4, 3, 100003
    g = torch.Generator().manual_seed(7)
    qsl = torch.tensor([0, 4, 8, 10, 14], dtype=torch.int32)
    logits = torch.randint(0, 3, (14, V), generator=g).float()
    logits[:, ::97] = float("nan")
    logits[:, 5::89] = float("-inf")
    logits[2] = float("-inf")
    logits[9] = float("nan")
    logits = logits.to(dtype)
    top = torch.nan_to_num(logits.float(), nan=-float("inf")).argmax(-1).to(torch.int32)  # [14]
    rows = (qsl[:-1, None] + torch.arange(K)[None, :]).clamp(max=13)  # [R, K]: the row judging each draft
    drafts = top[rows]
    drafts[1, 1] = V
    return logits, qsl, drafts, R


@cuda_test
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rejection_sample_cuda_ties_and_nans(kernel, dtype):
    logits, qsl, drafts, R = ties_and_nans_case(dtype)
    for temperature in (torch.zeros(R), torch.full((R,), 0.7)):
        _check_same(logits, qsl, drafts, temperature=temperature, seeds=torch.arange(R, dtype=torch.int64) * 31,
                    offset=3)


def realistic_case(R, K, V, greedy):
    """Drafts equal to the row's argmax half the time, so chains of every length occur; NaN in a few rows.
    Returns (logits, qsl, drafts, temperature)."""
    g = torch.Generator().manual_seed(11)
    qsl = torch.arange(0, R * (K + 1) + 1, K + 1, dtype=torch.int32)
    logits = (torch.randn(R * (K + 1), V, generator=g) * 2).to(torch.bfloat16)
    logits[5::97, 3::1009] = float("nan")
    top = logits.float().nan_to_num(nan=-float("inf")).argmax(-1).view(R, K + 1)[:, :K].to(torch.int32)
    drafts = torch.where(torch.rand(R, K, generator=g) < 0.5, top, torch.randint(0, V, (R, K), generator=g,
                                                                                   dtype=torch.int32))
    temperature = torch.zeros(R) if greedy else torch.rand(R, generator=g) + 0.5
    return logits, qsl, drafts, temperature


@cuda_test
@pytest.mark.parametrize("greedy", [True, False])
def test_rejection_sample_cuda_many_requests_realistic_drafts(kernel, greedy):
    """Many requests (splitv: several waves of blocks, so its early exit skips rows past recorded rejections)."""
    R = 384
    logits, qsl, drafts, temperature = realistic_case(R, 7, 32000, greedy)
    _check_same(logits, qsl, drafts, temperature=temperature, seeds=torch.arange(R, dtype=torch.int64), offset=9)


@cuda_test
def test_rejection_sample_cuda_huge_scaled_logits(kernel):
    """|max logit / temperature| >= 2^20: splitv re-runs the race on v1's routine (kernel_splitv.cuh NOTES)."""
    logits, qsl, drafts, _, _, seeds = _batch(16, 3, 70000, torch.float32, 3, False)
    logits = logits * 1e6
    temperature = torch.full((16,), 0.5)
    _check_same(logits, qsl, drafts, temperature=temperature, seeds=seeds, offset=1)


def sample_case(N, V, dtype):
    """(logits, temperature, seeds) of sample(): every fifth row greedy (also run by test_sampling_emu.py)."""
    logits = (torch.randn(N, V, generator=torch.Generator().manual_seed(V)) * 2).to(dtype)
    temperature = torch.rand(N) + 0.05
    temperature[::5] = 0
    return logits, temperature, torch.arange(N, dtype=torch.int64) * 7919


@cuda_test
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("V", [1, 5, 32000, 151937])
def test_sample_cuda_matches_cpu(kernel, dtype, V):
    logits, temperature, seeds = sample_case(50 if V < 100000 else 3, V, dtype)
    cpu = av.sample(logits, temperature, seeds, 3)
    gpu = av.sample(logits.cuda(), temperature.cuda(), seeds.cuda(), torch.tensor(3, device="cuda"))
    assert torch.equal(cpu, gpu.cpu())


@cuda_test
def test_rejection_sample_in_a_cuda_graph_with_device_offset(kernel):
    logits, qsl, drafts, q, temperature, seeds = _batch(32, 5, 500, torch.bfloat16, 1, False)
    dev = [t.cuda() for t in (logits, qsl, drafts, temperature, seeds)]
    offset = torch.tensor(0, dtype=torch.int64, device="cuda")
    out = (torch.empty(32, 6, dtype=torch.int32, device="cuda"), torch.empty(32, dtype=torch.int32, device="cuda"))

    def step():
        av.rejection_sample(dev[0], dev[1], dev[2], temperature=dev[3], seeds=dev[4], offset=offset, out=out)

    step()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    for off in (5, 6, 1000):
        offset.fill_(off)
        out[0].fill_(-7)
        graph.replay()
        torch.cuda.synchronize()
        want = av.rejection_sample(logits, qsl, drafts, temperature=temperature, seeds=seeds, offset=off)
        assert torch.equal(out[0].cpu(), want[0]) and torch.equal(out[1].cpu(), want[1])


@cuda_test
@pytest.mark.parametrize("V", [7, 32003, 151936])
@pytest.mark.parametrize("probs", [False, True])
def test_rejection_sample_cuda_truncation_and_logprobs(kernel, V, probs):
    """top_k / top_p / min_p (valid values; the CPU checks them) and logprobs: CUDA == CPU, both cuda_kernel names
    (truncation runs v1 whatever was chosen), then in a CUDA graph."""
    R, K = 24, 4
    logits, qsl, drafts, q, temperature, seeds = _batch(R, K, V, torch.bfloat16, V + 7 * probs, probs)
    g = torch.Generator().manual_seed(V)
    kw = dict(draft_probs=q, temperature=temperature, seeds=seeds, offset=9, logprobs=True,
              top_k=torch.tensor([0, 1, 5, 50])[torch.randint(0, 4, (R,), generator=g)].to(torch.int32),
              top_p=torch.tensor([1.0, 0.95, 0.6, 0.1])[torch.randint(0, 4, (R,), generator=g)],
              min_p=torch.tensor([0.0, 0.05, 0.3])[torch.randint(0, 3, (R,), generator=g)])
    cpu = av.rejection_sample(logits, qsl, drafts, **kw)
    gpu = av.rejection_sample(logits.cuda(), qsl.cuda(), drafts.cuda(), **_cuda(kw))
    for a, b in zip(cpu, gpu):
        assert torch.equal(a, b.cpu())
    dev = _cuda(dict(logits=logits, qsl=qsl, drafts=drafts, **kw))
    out = tuple(torch.empty_like(t) for t in gpu)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        av.rejection_sample(dev.pop("logits"), dev.pop("qsl"), dev.pop("drafts"), out=out, **dev)
    graph.replay()
    torch.cuda.synchronize()
    for a, b in zip(cpu, out):
        assert torch.equal(a, b.cpu())


@pytest.mark.parametrize("value", ["v3", "", "V2", 1])
def test_bad_sampler_kernel_names_the_argument(monkeypatch, value):
    logits = torch.randn(3, 10)
    qsl = torch.tensor([0, 2, 3], dtype=torch.int32)
    drafts = torch.zeros(2, 1, dtype=torch.int32)
    with pytest.raises(ValueError, match="^cuda_kernel"):
        av.rejection_sample(logits, qsl, drafts, cuda_kernel=value)
    with pytest.raises(ValueError, match="^cuda_kernel"):
        av.sample(logits, cuda_kernel=value)
    monkeypatch.setattr(sampling_module, "CUDA_KERNEL", value)
    with pytest.raises(ValueError, match=r"^adaptive_verify\.sampling\.CUDA_KERNEL"):
        av.rejection_sample(logits, qsl, drafts)


@pytest.mark.parametrize("value", ["v1", "splitv"])
def test_sampler_kernel_choice_is_ignored_on_cpu(monkeypatch, value):
    logits = torch.randn(3, 10, generator=torch.Generator().manual_seed(0))
    qsl = torch.tensor([0, 2, 3], dtype=torch.int32)
    drafts = torch.zeros(2, 1, dtype=torch.int32)
    want = av.rejection_sample(logits, qsl, drafts)
    monkeypatch.setattr(sampling_module, "CUDA_KERNEL", value)
    got = av.rejection_sample(logits, qsl, drafts)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    assert torch.equal(av.sample(logits), logits.argmax(-1).int())
    assert torch.equal(av.sample(logits, cuda_kernel=value), logits.argmax(-1).int())
