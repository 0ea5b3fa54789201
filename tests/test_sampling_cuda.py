"""Sampler CUDA kernels == C++ CPU kernels on the same seeds, and inside a captured CUDA graph with the
offset in a device tensor. Skipped without a GPU."""
import pytest
import torch

import adaptive_verify as av

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not av.cuda_available(), reason="needs an NVIDIA GPU and a CUDA build"),
]


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


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("V", [1, 7, 1000, 32003, 151936])
@pytest.mark.parametrize("probs", [False, True])
def test_rejection_sample_cuda_matches_cpu(dtype, V, probs):
    R, K = (64, 7) if V < 100000 else (8, 3)
    logits, qsl, drafts, q, temperature, seeds = _batch(R, K, V, dtype, V + probs, probs)
    kw = dict(draft_probs=q, temperature=temperature, seeds=seeds, offset=12345)
    cpu = av.rejection_sample(logits, qsl, drafts, **kw)
    gpu = av.rejection_sample(logits.cuda(), qsl.cuda(), drafts.cuda(),
                              **{k: (v.cuda() if isinstance(v, torch.Tensor) else v) for k, v in kw.items()})
    assert torch.equal(cpu[0], gpu[0].cpu()) and torch.equal(cpu[1], gpu[1].cpu())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_sample_cuda_matches_cpu(dtype):
    logits = (torch.randn(50, 32000) * 2).to(dtype)
    temperature = torch.rand(50) + 0.05
    temperature[::5] = 0
    seeds = torch.arange(50, dtype=torch.int64) * 7919
    cpu = av.sample(logits, temperature, seeds, 3)
    gpu = av.sample(logits.cuda(), temperature.cuda(), seeds.cuda(), torch.tensor(3, device="cuda"))
    assert torch.equal(cpu, gpu.cpu())


def test_rejection_sample_in_a_cuda_graph_with_device_offset():
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
