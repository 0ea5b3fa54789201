"""Runs every CUDA kernel not yet validated on hardware once, on small inputs, for compute-sanitizer:

    compute-sanitizer --tool racecheck --error-exitcode 1 python3 benchmarks/sanitize_kernels.py
    compute-sanitizer --tool memcheck --error-exitcode 1 python3 benchmarks/sanitize_kernels.py

Covers verify_attention's candidate "mma" and "mma_fused" (and every kernel with a draft-tree mask, and with fp8
caches), verify_attention_mla's kernels (bf16 and fp8 latent caches), the
planner's one-algorithm kernel (2026-12-01), the sampler's candidate "splitv" (the split-vocabulary kernel
with its cross-block early exit) and the tree sampler (tree_rejection_sample, with logprobs and truncation): the
shared-memory races and out-of-bounds accesses the host emulator (tests/emu) cannot see on real hardware. Sizes are small because the sanitizer
slows kernels down 10-100x; each case still spans several splits, chunks and blocks. Exits 1 if any result
disagrees with the CPU kernel (attention: within the float32 tolerance; planner and sampler: exactly).
"""
import sys

import torch

import adaptive_verify as av


def attention_cases():
    g = torch.Generator().manual_seed(1)
    R, Hkv, group, D, bs = 3, 2, 4, 128, 16
    q_lens = [1, 5, 8]
    seq = [700, 1300, 40]
    qsl = torch.tensor([0, 1, 6, 14], dtype=torch.int32)
    T = 16  # two padding tokens past query_start_loc[R]
    blocks = [-(-s // bs) for s in seq]
    num_blocks = sum(blocks) + 2
    table = torch.zeros(R, max(blocks), dtype=torch.int32)
    perm = torch.randperm(num_blocks, generator=g)
    at = 0
    for r, n in enumerate(blocks):
        table[r, :n] = perm[at:at + n]
        at += n
    q = torch.randn(T, Hkv * group, D, generator=g).to(torch.bfloat16)
    kc = torch.randn(num_blocks, bs, Hkv, D, generator=g).to(torch.bfloat16)
    vc = torch.randn(num_blocks, bs, Hkv, D, generator=g).to(torch.bfloat16)
    args = (q, kc, vc, table, torch.tensor(seq, dtype=torch.int32), qsl, max(q_lens))
    want = av.verify_attention(*args).float()
    dev = [a.cuda() if isinstance(a, torch.Tensor) else a for a in args]
    for kernel in ("mma", "mma_fused"):
        got = av.verify_attention(*dev, cuda_kernel=kernel).float().cpu()
        err = (got - want).abs().max().item()
        yield f"verify_attention {kernel}", err <= 0.05, f"max |diff| vs CPU {err:.3g}"
    # draft-tree masks ([T] int64): request 1 a star (every node under the anchor), request 2 a branching tree
    mask = torch.tensor([1, 1, 3, 5, 9, 17, 1, 3, 5, 11, 19, 35, 69, 133, -1, -1], dtype=torch.int64)
    want = av.verify_attention(*args, tree_mask=mask).float()
    for kernel in ("rowwise", "mma", "mma_fused"):
        got = av.verify_attention(*dev, cuda_kernel=kernel, tree_mask=mask.cuda()).float().cpu()
        err = (got - want).abs().max().item()
        yield f"verify_attention {kernel} tree_mask", err <= 0.05, f"max |diff| vs CPU {err:.3g}"


def kv_cache_variant_cases():
    """fp8 KV caches (per-head scales) through every GQA kernel, and MLA (bf16 and fp8 latent caches) through both of
    its kernels, each against the CPU kernel."""
    g = torch.Generator().manual_seed(4)
    qsl = torch.tensor([0, 3, 8, 9], dtype=torch.int32)
    seq = torch.tensor([600, 90, 1100], dtype=torch.int32)
    bs = 16
    table = torch.randperm(3 * 70, generator=g)[:3 * 69].to(torch.int32).view(3, 69)
    q = torch.randn(10, 8, 128, generator=g).to(torch.bfloat16)
    kc = torch.randn(3 * 70, bs, 2, 128, generator=g).to(torch.float8_e4m3fn)
    vc = torch.randn(3 * 70, bs, 2, 128, generator=g).to(torch.float8_e4m3fn)
    ks, vs = torch.tensor([0.5, 0.25]), torch.tensor([0.125, 1.0])
    args = (q, kc, vc, table, seq, qsl, 5)
    want = av.verify_attention(*args, k_scale=ks, v_scale=vs).float()
    dev = [a.cuda() if isinstance(a, torch.Tensor) else a for a in args]
    for kernel in ("rowwise", "mma", "mma_fused"):
        got = av.verify_attention(*dev, cuda_kernel=kernel, k_scale=ks.cuda(), v_scale=vs.cuda()).float().cpu()
        err = (got - want).abs().max().item()
        yield f"verify_attention {kernel} fp8", err <= 0.05, f"max |diff| vs CPU {err:.3g}"
    # sinks, a window cutting through the longest request and soft-capping, on the bf16 copy of the same caches
    kb, vb = (kc.float() * 0.5).to(torch.bfloat16), (vc.float() * 0.5).to(torch.bfloat16)
    variants = dict(sinks=torch.linspace(-1.0, 2.0, 8), window_left=300, softcap=30.0)
    args = (q, kb, vb, table, seq, qsl, 5)
    want = av.verify_attention(*args, **variants).float()
    dev = [a.cuda() if isinstance(a, torch.Tensor) else a for a in args]
    dev_variants = {k: v.cuda() if isinstance(v, torch.Tensor) else v for k, v in variants.items()}
    for kernel in ("rowwise", "mma", "mma_fused"):
        got = av.verify_attention(*dev, cuda_kernel=kernel, **dev_variants).float().cpu()
        err = (got - want).abs().max().item()
        yield f"verify_attention {kernel} sinks+window+softcap", err <= 0.05, f"max |diff| vs CPU {err:.3g}"
    q = torch.randn(10, 16, 576, generator=g).to(torch.bfloat16)
    for kv_cache, kv_scale in ((torch.randn(3 * 70, bs, 576, generator=g).to(torch.bfloat16), None),
                               (torch.randn(3 * 70, bs, 576, generator=g).to(torch.float8_e4m3fn), 0.5)):
        args = (q, kv_cache, table, seq, qsl, 5)
        want = av.verify_attention_mla(*args, scale=0.07, kv_scale=kv_scale).float()
        dev = [a.cuda() if isinstance(a, torch.Tensor) else a for a in args]
        for kernel in ("rowwise", "mma"):
            got = av.verify_attention_mla(*dev, scale=0.07, kv_scale=kv_scale, cuda_kernel=kernel).float().cpu()
            err = (got - want).abs().max().item()
            yield f"verify_attention_mla {kernel} {kv_cache.dtype}", err <= 0.05, f"max |diff| vs CPU {err:.3g}"


def planner_case():
    g = torch.Generator().manual_seed(2)
    R, K = 64, 8
    survival = av.prefix_survival(torch.rand(R, K, generator=g) * 0.6 + 0.4,
                                  torch.randint(0, K + 1, (R,), generator=g, dtype=torch.int32))
    drafts = torch.randint(0, K + 1, (R,), generator=g, dtype=torch.int32)
    table = av.CostTable.from_points({1: 4.0, 64: 4.4, 256: 5.5, 1024: 9.0}, draft_ms={1: 0.5, 256: 1.0})
    want = av.plan_verification(survival, drafts, table, mode="greedy")
    got = av.plan_verification(survival.cuda(), drafts.cuda(), table, mode="greedy")
    same = torch.equal(want.verify_lens, got.verify_lens.cpu()) and int(want.budget) == int(got.budget)
    yield "plan", same, f"budget {int(got.budget)} (CPU {int(want.budget)})"


def sampler_cases():
    g = torch.Generator().manual_seed(3)
    R, K, V = 8, 3, 5003
    qsl = torch.arange(0, R * (K + 1) + 1, K + 1, dtype=torch.int32)
    logits = (torch.randn(R * (K + 1), V, generator=g) * 2).to(torch.bfloat16)
    top = logits.float().argmax(-1).view(R, K + 1)[:, :K].to(torch.int32)
    drafts = torch.where(torch.rand(R, K, generator=g) < 0.6, top, torch.randint(0, V, (R, K), generator=g,
                                                                                   dtype=torch.int32))
    temperature = torch.tensor([0.0, 0.7] * (R // 2))
    seeds = torch.arange(R, dtype=torch.int64)
    want = av.rejection_sample(logits, qsl, drafts, temperature=temperature, seeds=seeds, offset=5)
    got = av.rejection_sample(logits.cuda(), qsl.cuda(), drafts.cuda(), temperature=temperature.cuda(),
                              seeds=seeds.cuda(), offset=5, cuda_kernel="splitv")
    row_temp, row_seeds = temperature.repeat_interleave(K + 1), seeds.repeat_interleave(K + 1)
    toks = av.sample(logits.cuda(), row_temp.cuda(), row_seeds.cuda(), 5, cuda_kernel="splitv")
    want_toks = av.sample(logits, row_temp, row_seeds, 5)
    yield "rejection_sample splitv", torch.equal(want[0], got[0].cpu()) and torch.equal(want[1], got[1].cpu()), ""
    yield "sample splitv", torch.equal(want_toks, toks.cpu()), ""
    # tree_rejection_sample: per request the anchor and two levels (offsets 1-3 under the anchor, 4-6 under
    # offset 1), each token's row favouring its first child's id so that paths go deep; request 3 is padding.
    qsl_t = torch.tensor([0, 7, 14, 21, 21, 28, 35, 42, 49], dtype=torch.int32)
    parent = torch.tensor([-1, 0, 0, 0, 1, 1, 1] * 7, dtype=torch.int32)
    ids = torch.randint(0, V, (49,), generator=g, dtype=torch.int32)
    tl = (torch.randn(49, V, generator=g) * 2)
    for t in range(0, 49, 7):
        tl[t, ids[t + 1]] = tl[t + 1, ids[t + 4]] = 12.0
    tl = tl.to(torch.bfloat16)
    kw = dict(temperature=temperature, seeds=seeds, offset=5, logprobs=True,
              top_k=torch.tensor([0, 50] * (R // 2), dtype=torch.int32))
    want_t = av.tree_rejection_sample(tl, qsl_t, parent, ids, 7, **kw)
    got_t = av.tree_rejection_sample(tl.cuda(), qsl_t.cuda(), parent.cuda(), ids.cuda(), 7,
                                     **{k: v.cuda() if isinstance(v, torch.Tensor) else v for k, v in kw.items()})
    yield "tree_rejection_sample", all(torch.equal(a, b.cpu()) for a, b in zip(want_t, got_t)), \
        f"tokens emitted {got_t[1].tolist()}"


def main() -> int:
    if not av.cuda_available():
        print("needs an NVIDIA GPU and a CUDA build")
        return 1
    ok = True
    for cases in (attention_cases, kv_cache_variant_cases, planner_case, sampler_cases):
        for name, good, detail in cases():
            torch.cuda.synchronize()
            print(f"{'ok  ' if good else 'FAIL'} {name} {detail}")
            ok = ok and good
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
