"""Under torch.compile the public ops go through their torch.library custom ops (fake implementations for
tracing); the compiled results must equal eager ones."""
import pytest
import torch

import adaptive_verify as av

dynamo = pytest.importorskip("torch._dynamo")


def test_confidence_stats_and_sampling_compile_like_eager():
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(4, 3, 32, generator=g).to(torch.bfloat16)
    weight = torch.randn(32, generator=g)
    temperature = torch.tensor([1.0, 0.8, 1.2])
    logits = torch.randn(9, 50, generator=g)
    qsl = torch.tensor([0, 3, 5, 7, 9], dtype=torch.int32)
    drafts = torch.randint(0, 50, (4, 3), generator=g, dtype=torch.int32)
    seeds = torch.arange(4, dtype=torch.int64)

    def step(hidden, logits, drafts):
        conf = av.confidence(hidden, weight, bias=0.1, temperature=temperature)
        surv = av.confidence_from_logits(conf.logit(), survival=True)
        margin = av.draft_margin(logits.view(3, 3, 50))
        tokens, emitted = av.rejection_sample(logits, qsl, drafts, temperature=torch.ones(4), seeds=seeds, offset=7)
        first = av.sample(logits, torch.ones(9), torch.arange(9, dtype=torch.int64), 3)
        return conf, surv, margin, tokens, emitted, first

    dynamo.reset()
    eager = step(hidden, logits, drafts)
    compiled = torch.compile(step, fullgraph=False)(hidden, logits, drafts)
    for e, c in zip(eager, compiled):
        assert torch.equal(e, c)
    explained = dynamo.explain(step)(hidden, logits, drafts)
    ops = " ".join(str(n.target) for gm in explained.graphs for n in gm.graph.nodes if n.op == "call_function")
    for name in ("confidence_into", "confidence_from_logits_into", "draft_margin_into", "rejection_sample_into",
                 "sample_into"):
        assert name in ops, f"{name} is not in the compiled graph"


def test_acceptance_stats_update_compiles():
    stats_eager, stats_compiled = av.AcceptanceStats(3), av.AcceptanceStats(3)
    conf = torch.rand(5, 3)
    vl = torch.tensor([3, 2, 1, 0, 3], dtype=torch.int32)
    na = torch.tensor([3, 1, 0, 0, 2], dtype=torch.int32)
    stats_eager.update(conf, vl, na)
    dynamo.reset()
    torch.compile(stats_compiled.update, fullgraph=False)(conf, vl, na)
    assert torch.equal(stats_eager.trials, stats_compiled.trials)
    assert torch.equal(stats_eager.survivals, stats_compiled.survivals)
