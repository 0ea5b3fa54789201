"""Confidence-area CUDA kernels == CPU kernels (within fp32 reordering), stats inside a CUDA graph."""
import pytest
import torch

import adaptive_verify as av
from adaptive_verify import reference as ref

pytestmark = [
    pytest.mark.cuda,
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("R,K,H,Q", [(1, 1, 64, 0), (13, 7, 769, 256), (256, 8, 7168, 256), (5, 16, 4096, 0)])
@pytest.mark.parametrize("strided", [False, True])
def test_confidence_cuda_matches_cpu(dtype, R, K, H, Q, strided):
    g = torch.Generator().manual_seed(R * K + H)
    if strided:  # misaligned rows take the scalar-load path
        hidden = torch.randn(R, 2 * K, H + 3, generator=g).to(dtype)[:, ::2, 1:1 + H]
    else:
        hidden = torch.randn(R, K, H, generator=g).to(dtype)
    markov = torch.randn(R, K, Q, generator=g).to(dtype) if Q else None
    weight = torch.randn(H + Q, generator=g) / (H + Q) ** 0.5
    temperature = torch.rand(K, generator=g) + 0.5
    for survival in (False, True):
        cpu = av.confidence(hidden, weight, bias=0.2, markov=markov, temperature=temperature, survival=survival)
        gpu = av.confidence(hidden.cuda(), weight.cuda(), bias=torch.tensor(0.2, device="cuda"),
                            markov=None if markov is None else markov.cuda(), temperature=temperature.cuda(),
                            survival=survival)
        # Both kernels accumulate in fp32 in different orders: each must sit within the rounding envelope
        # of a same-precision torch computation around the float64 oracle (as the CPU test checks).
        kw = dict(bias=0.2, markov=markov, temperature=temperature, survival=survival)
        want = ref.confidence(hidden, weight, **kw)
        tol = 8 * (ref.confidence(hidden, weight, **kw, dtype=torch.float32).double() - want).abs().max().item() + 2e-6
        assert (gpu.cpu().double() - want).abs().max().item() <= tol
        assert (cpu.double() - want).abs().max().item() <= tol
        again = av.confidence(hidden.cuda(), weight.cuda(), bias=0.2, markov=None if markov is None else markov.cuda(),
                              temperature=temperature.cuda(), survival=survival)
        assert torch.equal(gpu, again), "the kernel must be deterministic run to run"


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("V", [1, 7, 32000, 151936])
def test_draft_margin_cuda_matches_cpu(dtype, V):
    x = (torch.randn(4, 3, V) * 3).to(dtype)
    x[1, 1, V // 2] = float("nan")
    av.reset_error_counts("cuda")
    # The NaN row's margin is NaN on both devices: compare bit for bit with NaN equal to NaN.
    torch.testing.assert_close(av.draft_margin(x.cuda()).cpu(), av.draft_margin(x), rtol=0, atol=0, equal_nan=True)
    assert av.error_counts("cuda")["nan_logits"] == 1
    strided = (torch.randn(4, 6, V + 1) * 3).to(dtype)[:, ::2, 1:]
    assert torch.equal(av.draft_margin(strided.cuda()).cpu(), av.draft_margin(strided))


def test_confidence_from_logits_cuda_matches_cpu():
    logits = torch.randn(300, 12) * 3
    t = torch.rand(12) + 0.5
    for survival in (False, True):
        torch.testing.assert_close(av.confidence_from_logits(logits.cuda(), t.cuda(), survival=survival).cpu(),
                                   av.confidence_from_logits(logits, t, survival=survival), rtol=1e-6, atol=1e-7)


def test_stats_update_cuda_matches_cpu_and_runs_in_a_graph():
    g = torch.Generator().manual_seed(0)
    conf = torch.rand(200, 8, generator=g)
    vl = torch.randint(0, 9, (200,), generator=g, dtype=torch.int32)
    na = (torch.rand(200, generator=g) * (vl + 1).float()).floor().to(torch.int32)
    cpu = av.AcceptanceStats(8)
    cpu.update(conf, vl, na)
    gpu = av.AcceptanceStats(8, device="cuda")
    bufs = [conf.cuda(), vl.cuda(), na.cuda()]
    gpu.update(*bufs)  # warm-up outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        gpu.update(*bufs)
    for _ in range(3):
        graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(gpu.trials.cpu(), 4 * cpu.trials)
    assert torch.equal(gpu.totals.cpu(), 4 * cpu.totals)
    assert torch.equal(gpu.survivals.cpu(), 4 * cpu.survivals)
    assert torch.equal(gpu._conf_fixed.cpu(), 4 * cpu._conf_fixed)


def test_stats_rows_at_positions_cuda_match_cpu_and_count_bad_positions():
    g = torch.Generator().manual_seed(1)
    conf = torch.rand(300, 2, generator=g)
    vl = torch.randint(0, 3, (300,), generator=g, dtype=torch.int32)
    na = torch.randint(0, 3, (300,), generator=g, dtype=torch.int32)
    pos = torch.randint(0, 6, (300,), generator=g, dtype=torch.int32)
    cpu = av.AcceptanceStats(8)
    cpu.update(conf, vl, na, positions=pos)
    gpu = av.AcceptanceStats(8, device="cuda")
    gpu.update(conf.cuda(), vl.cuda(), na.cuda(), positions=pos.cuda())
    for name in ("trials", "survivals", "_conf_fixed", "totals"):
        assert torch.equal(getattr(gpu, name).cpu(), getattr(cpu, name)), name
    av.reset_error_counts("cuda")
    bad = torch.full((300,), 7, dtype=torch.int32)  # a second trial of a row lands at position 8
    before = gpu.trials.clone()
    gpu.update(conf.cuda(), vl.cuda(), na.cuda(), positions=bad.cuda())
    n = int(((torch.minimum(vl, na + 1)) >= 2).sum())
    assert av.error_counts("cuda")["stats_position_out_of_range"] == n
    assert int((gpu.trials - before).sum()) == int((torch.minimum(vl, na + 1).clamp(0, 2) >= 1).sum())
