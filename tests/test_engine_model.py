"""The in-repo engine (adaptive_verify.engine): the paged forward path of TinyTarget against its dense
oracle, the drafter's API, and the shipped weights against their report.json. No training here."""
import json
import math
import os

import pytest
import torch

from adaptive_verify.engine import WEIGHTS_DIR, DSparkDrafter, PagedKV, TinyTarget, load_pretrained

torch.set_num_threads(1)
BLOCK = 16
FAR_BLOCK = 2**30  # unused block-table entries: far out of range, must never be read
HAVE_WEIGHTS = all(os.path.isfile(os.path.join(WEIGHTS_DIR, f)) for f in ("target.pt", "drafter.pt", "report.json"))


def _random_target(seed=0) -> TinyTarget:
    """A TinyTarget with weights large enough that attention is far from uniform (the default init is not)."""
    torch.manual_seed(seed)
    model = TinyTarget().eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 2:
                p.normal_(0, 0.08)
    return model


def _run_paged(model, seqs, join_step, prefill_chunk, decode_q_lens, steps):
    """Drives several requests through forward_paged: each joins at its step, prefills its prompt in chunks
    of ``prefill_chunk`` then advances ``decode_q_lens[r]`` tokens per step (verification-like q_len > 1).
    Blocks are allocated on demand from one PagedKV, so requests' blocks interleave. Returns, per request,
    the paged logits [len, 256] of every token it processed."""
    kv = PagedKV.for_model(model.config, num_blocks=64, block_size=BLOCK)
    for cache in kv.k + kv.v:
        cache.fill_(float("nan"))  # every slot a request reads must have been written this run
    done = [0] * len(seqs)
    blocks = [[] for _ in seqs]
    prompt = [len(s) // 2 for s in seqs]
    out = [[] for _ in seqs]
    for step in range(steps):
        active = [r for r in range(len(seqs)) if join_step[r] <= step and done[r] < len(seqs[r])]
        if not active:
            continue
        ids, pos, slots, qsl, seq_lens, q_lens = [], [], [], [0], [], []
        for r in active:
            n = min(prefill_chunk, prompt[r] - done[r]) if done[r] < prompt[r] else decode_q_lens[r]
            n = min(n, len(seqs[r]) - done[r])
            need = -(-(done[r] + n) // BLOCK) - len(blocks[r])
            blocks[r] += kv.allocate(need)
            p = torch.arange(done[r], done[r] + n)
            ids.append(seqs[r][p]); pos.append(p); slots.append(kv.slots(blocks[r], p))
            qsl.append(qsl[-1] + n); seq_lens.append(done[r] + n); q_lens.append(n)
        max_blocks = max(len(blocks[r]) for r in active) + 2
        table = torch.full((len(active), max_blocks), FAR_BLOCK, dtype=torch.int32)
        for i, r in enumerate(active):
            table[i, :len(blocks[r])] = torch.tensor(blocks[r], dtype=torch.int32)
        logits, hidden = model.forward_paged(
            torch.cat(ids), torch.cat(pos).to(torch.int32), kv, table, torch.tensor(seq_lens, dtype=torch.int32),
            torch.tensor(qsl, dtype=torch.int32), torch.cat(slots), max(q_lens))
        assert logits.shape == (qsl[-1], 256) and hidden.shape == (qsl[-1], model.config.d_model)
        for i, r in enumerate(active):
            out[r].append(logits[qsl[i]:qsl[i + 1]])
            done[r] += q_lens[i]
    assert done == [len(s) for s in seqs], "the schedule did not finish every request"
    return [torch.cat(o) for o in out], blocks


@torch.no_grad()
def test_paged_matches_dense_chunked_prefill_and_multi_token_decode():
    model = _random_target()
    gen = torch.Generator().manual_seed(1)
    lengths = [57, 90, 23, 71]
    seqs = [torch.randint(0, 256, (n,), generator=gen) for n in lengths]
    paged, blocks = _run_paged(model, seqs, join_step=[0, 1, 3, 4], prefill_chunk=13,
                               decode_q_lens=[3, 5, 2, 7], steps=40)
    # Requests joined at different steps and grew one block at a time, so their blocks interleave.
    assert any(b != list(range(b[0], b[0] + len(b))) for b in blocks)
    for seq, got in zip(seqs, paged):
        ref16, _ = model.forward_dense(seq[None], attn_dtype=torch.float16)  # same rounding as the paged caches
        ref32, _ = model.forward_dense(seq[None])
        assert torch.isfinite(got).all()
        # Tolerances relative to the fp16 rounding the oracle itself shows against fp32: the paged path
        # differs from the same-rounding oracle only by summation order (an occasional fp16 ulp flip).
        rounding = (ref16[0] - ref32[0]).abs().max().item()
        assert 0 < rounding < 0.05
        assert (got - ref16[0]).abs().max().item() <= 0.5 * rounding
        assert (got - ref32[0]).abs().max().item() <= 2 * rounding


@torch.no_grad()
def test_paged_single_token_decode_and_block_reuse():
    model = _random_target(seed=2)
    gen = torch.Generator().manual_seed(3)
    seqs = [torch.randint(0, 256, (n,), generator=gen) for n in (19, 33)]
    paged, _ = _run_paged(model, seqs, join_step=[0, 0], prefill_chunk=16, decode_q_lens=[1, 1], steps=40)
    for seq, got in zip(seqs, paged):
        ref16, _ = model.forward_dense(seq[None], attn_dtype=torch.float16)
        ref32, _ = model.forward_dense(seq[None])
        assert (got - ref16[0]).abs().max().item() <= 0.5 * (ref16[0] - ref32[0]).abs().max().item()


def test_paged_kv_allocator():
    kv = PagedKV(num_layers=1, num_blocks=4, block_size=16, n_kv_heads=2, head_dim=64)
    a, b = kv.allocate(2), kv.allocate(1)
    assert a == [0, 1] and b == [2] and kv.num_free == 1
    kv.free(a)
    assert kv.allocate(3) == [0, 1, 3]
    with pytest.raises(RuntimeError, match="asked for 1 blocks, only 0 free"):
        kv.allocate(1)
    assert kv.slots([3, 0], torch.tensor([0, 15, 16, 20])).tolist() == [48, 63, 0, 4]


@torch.no_grad()
def test_drafter_api_and_fused_confidence():
    torch.manual_seed(0)
    drafter = DSparkDrafter().eval()
    drafter.conf_weight.normal_(0, 0.1)
    drafter.conf_bias.fill_(0.3)
    drafter.conf_temperature.copy_(torch.linspace(0.5, 2.0, drafter.config.num_drafts))
    R, K = 5, drafter.config.num_drafts
    tokens, hidden, markov = drafter.draft(torch.randn(R, 256), torch.randint(0, 256, (R,)))
    assert tokens.dtype == torch.int32 and tokens.shape == (R, K)
    assert hidden.shape == (R, K, drafter.config.hidden) and markov.shape == (R, K, drafter.config.q_features)
    # The fused op equals the head written out in torch.
    expected = torch.sigmoid(drafter.confidence_logits(hidden, markov) / drafter.conf_temperature)
    torch.testing.assert_close(drafter.confidence(hidden, markov), expected, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(drafter.confidence(hidden, markov, survival=True), expected.cumprod(1),
                               rtol=1e-5, atol=1e-6)


@torch.no_grad()
def test_tree_verification_matches_per_anchor_forward():
    """The tree-attention forward that training uses for exact acceptance: the logits at draft j of anchor p
    equal a plain causal forward of text[:p + 1] followed by that anchor's drafts 0..j."""
    from adaptive_verify.engine.verify import tree_mask

    model = _random_target(seed=4)
    gen = torch.Generator().manual_seed(5)
    L, K = 29, 5
    text = torch.randint(0, 256, (1, L), generator=gen)
    anchors = torch.tensor([1, 7, 8, 20, L - K])
    branches = torch.randint(0, 256, (anchors.numel(), K - 1), generator=gen)  # [P, K-1]
    mask, pos = tree_mask(L, anchors, K)
    logits, _ = model.forward_dense(torch.cat([text, branches.flatten()[None]], 1), positions=pos, attn_mask=mask)
    for i, p in enumerate(anchors.tolist()):
        ref, _ = model.forward_dense(torch.cat([text[:, :p + 1], branches[i][None]], 1))
        torch.testing.assert_close(logits[0, p], ref[0, p], rtol=1e-4, atol=1e-4)
        got_branch = logits[0, L + i * (K - 1):L + (i + 1) * (K - 1)]
        torch.testing.assert_close(got_branch, ref[0, p + 1:], rtol=1e-4, atol=1e-4)


def test_load_pretrained_missing_weights(tmp_path):
    with pytest.raises(FileNotFoundError, match="target.pt"):
        load_pretrained(weights_dir=str(tmp_path))


@pytest.mark.skipif(not HAVE_WEIGHTS, reason="no shipped weights in adaptive_verify/engine/weights")
@torch.no_grad()
def test_shipped_weights_match_report():
    from adaptive_verify.engine.data import load_stdlib
    from adaptive_verify.engine.train import SEQ_LEN, bits_per_byte, collect
    from adaptive_verify.engine.metrics import acceptance_report

    with open(os.path.join(WEIGHTS_DIR, "report.json")) as f:
        report = json.load(f)
    target, drafter = load_pretrained()
    _, held_out, _ = load_stdlib()
    # Fewer, different windows than the report (64 / 32): the same quantities, so they agree within the
    # spread between window samples (measured: about 0.2 bits/byte and 0.05 acceptance at these sizes).
    bpb = bits_per_byte(target, held_out, windows=32, seed=6)
    assert math.isfinite(bpb) and bpb < 8.0
    assert abs(bpb - report["target"]["held_out_bits_per_byte"]) < 0.4
    hid, mar, acc = collect(target, drafter, held_out, windows=12, seed=6, length=SEQ_LEN)
    measured = acceptance_report(acc)
    reported = report["drafter"]["acceptance_cumulative"]
    for j in range(len(reported)):
        assert abs(measured["acceptance_cumulative"][j] - reported[j]) < 0.12, (j, measured, reported)
    assert reported[0] > 0.5  # well above chance (1/256) at the first draft
    conf = drafter.confidence(hid, mar, survival=True)
    assert torch.isfinite(conf).all() and conf.min() >= 0 and conf.max() <= 1
