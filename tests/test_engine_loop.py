"""The end-to-end speculative loop on the shipped tiny model: greedy and sampling losslessness in every
mode, continuous batching, determinism."""
import numpy as np
import pytest
import torch

from adaptive_verify.engine import load_pretrained
from adaptive_verify.engine.generate import generate
import token_stats
from token_stats import NEW, PROMPTS, chi2_same, second_token_pvalue, token_counts

MODES = ("all", "lagged", "greedy")


@pytest.fixture(scope="module")
def models():
    return token_stats.pretrained()


def test_greedy_is_lossless_in_every_mode(models):
    """Temperature 0: every mode emits exactly what plain greedy decoding of the target alone emits
    (mode "off": no drafter, one token per step), for prompts of different lengths joining and leaving
    a batch of 3, and the drafter really gets drafts accepted."""
    target, drafter = models
    plain = generate(target, None, PROMPTS, mode="off", max_new_tokens=40, concurrency=3)
    for mode in MODES:
        spec = generate(target, drafter, PROMPTS, mode=mode, max_new_tokens=40, concurrency=3)
        assert spec.tokens == plain.tokens, mode
        assert spec.figures["accepted_per_step"] > 0.5, mode
        assert spec.figures["steps"] < plain.figures["steps"], mode


def test_plain_decoding_matches_the_dense_model(models):
    """Mode "off" through the paged cache is the target's own greedy decoding (dense attention with the
    same fp16 rounding of q/k/v), so the reference above is the target alone."""
    target, _ = models
    prompt = PROMPTS[0]
    out = generate(target, None, [prompt], mode="off", max_new_tokens=24).tokens[0]
    ids = list(prompt.encode())
    for _ in range(24):
        logits, _ = target.forward_dense(torch.tensor([ids]), attn_dtype=torch.float16)
        ids.append(int(logits[0, -1].argmax()))
    dense = ids[len(prompt.encode()):]
    agree = np.mean([a == b for a, b in zip(out, dense)])
    assert out[:8] == dense[:8] and agree >= 0.9




@pytest.fixture(scope="module")
def plain_samples(models):
    return token_stats.plain_samples(models[0])


@pytest.mark.parametrize("mode", MODES)
def test_sampling_is_lossless(models, plain_samples, mode):
    """Temperature 1: generated tokens 2..7 (all judged by verification, drafts at every position 0..5 of the
    first decode step) have the distribution of plain sampling from the target (two-sample chi-square over
    1200 seeds), and the second token's distribution matches the target's exact one."""
    target, drafter = models
    n = token_stats.SAMPLES
    prompt = [token_stats.PROMPT] * n
    plain = plain_samples
    spec = generate(target, drafter, prompt, mode=mode, max_new_tokens=NEW, concurrency=64, temperature=1.0,
                    seed=20_000).tokens
    for index in range(1, NEW):
        p = chi2_same(token_counts(spec, index), token_counts(plain, index))
        assert p > 1e-3, (mode, index, p)
    assert second_token_pvalue(target, spec) > 1e-3, mode


def test_same_seed_same_tokens_and_batch_invariance(models):
    target, drafter = models
    a = generate(target, drafter, PROMPTS, mode="lagged", max_new_tokens=20, concurrency=3, temperature=1.0, seed=7)
    b = generate(target, drafter, PROMPTS, mode="lagged", max_new_tokens=20, concurrency=3, temperature=1.0, seed=7)
    assert a.tokens == b.tokens
    c = generate(target, drafter, PROMPTS, mode="lagged", max_new_tokens=20, concurrency=3, temperature=1.0, seed=8)
    assert c.tokens != a.tokens
    # A request's tokens do not depend on its batch: in mode "all" (no budget coupling between requests)
    # concurrency 1 and 4 give the same tokens at temperature 1.
    alone = generate(target, drafter, PROMPTS, mode="all", max_new_tokens=20, concurrency=1, temperature=1.0, seed=7)
    batched = generate(target, drafter, PROMPTS, mode="all", max_new_tokens=20, concurrency=4, temperature=1.0, seed=7)
    assert alone.tokens == batched.tokens


def test_generate_errors(models):
    target, drafter = models
    with pytest.raises(ValueError, match="mode"):
        generate(target, drafter, ["a"], mode="fast")
    with pytest.raises(ValueError, match="drafter is required"):
        generate(target, None, ["a"], mode="lagged")
    with pytest.raises(ValueError, match="max_new_tokens"):
        generate(target, drafter, ["a"], max_new_tokens=0)
    with pytest.raises(ValueError, match="concurrency"):
        generate(target, drafter, ["a"], concurrency=0)
    with pytest.raises(ValueError, match="prompts must not be empty"):
        generate(target, drafter, [""])


def test_verifier_metrics_are_reported(models):
    target, drafter = models
    r = generate(target, drafter, PROMPTS, mode="lagged", max_new_tokens=30, concurrency=4)
    m = r.figures["verifier"]
    assert m["steps"] == r.figures["steps"]
    assert 0.0 < m["acceptance_rate"] <= 1.0 and np.isfinite(m["ece"])
    assert m["verified_per_step"] > 0 and sum(m["graph_use"].values()) == m["steps"]


def test_demo_command(capsys):
    from adaptive_verify import cli

    assert cli.main(["demo", "--max-new-tokens", "12", "--mode", "off", "--mode", "lagged", "--mode", "all"]) == 0
    out = capsys.readouterr().out
    assert "lagged" in out and "tokens/s" in out and "every mode generated the same text: yes" in out
    assert cli.main(["demo", "--concurrency", "0"]) == 1


def test_cuda_graphs_need_a_cuda_device(models):
    target, drafter = models
    with pytest.raises(ValueError, match="cuda_graphs=True needs the models on a CUDA device"):
        generate(target, drafter, ["a"], cuda_graphs=True)


@pytest.mark.cuda
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_captured_graph_loop_matches_eager(temperature):
    """On CUDA, the verification step captured per (requests, padded tokens) and replayed emits exactly
    the eager loop's tokens, in every speculative mode, with requests joining and leaving."""
    target, drafter = load_pretrained(device="cuda")
    for mode in MODES:
        eager = generate(target, drafter, PROMPTS, mode=mode, max_new_tokens=32, concurrency=3,
                         temperature=temperature)
        graph = generate(target, drafter, PROMPTS, mode=mode, max_new_tokens=32, concurrency=3,
                         temperature=temperature, cuda_graphs=True)
        assert graph.tokens == eager.tokens, mode
        assert graph.figures["graph_captures"] >= 1
        assert graph.figures["graph_replays"] == graph.figures["steps"]
