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


def _step_inputs():
    """One decode step of a tiny model: 3 requests x 4 drafts, a paged KV cache, target logits."""
    g = torch.Generator().manual_seed(5)
    R, K, Hq, Hkv, D, bs, V = 3, 4, 4, 2, 64, 16, 37
    conf = torch.rand(R, K, generator=g) * 0.6 + 0.4
    drafts = torch.tensor([4, 2, 3], dtype=torch.int32)
    context = torch.tensor([5, 17, 0], dtype=torch.int32)
    block_table = torch.arange(R * 4, dtype=torch.int32).view(R, 4)
    anchors = torch.randint(0, V, (R,), generator=g, dtype=torch.int32)
    draft_tokens = torch.randint(0, V, (R, K), generator=g, dtype=torch.int32)
    k_cache = torch.randn(R * 4, bs, Hkv, D, generator=g).to(torch.bfloat16)
    v_cache = torch.randn(R * 4, bs, Hkv, D, generator=g).to(torch.bfloat16)
    T = R * (K + 1)
    q = torch.randn(T, Hq, D, generator=g).to(torch.bfloat16)
    k_new = torch.randn(T, Hkv, D, generator=g).to(torch.bfloat16)
    v_new = torch.randn(T, Hkv, D, generator=g).to(torch.bfloat16)
    logits = torch.randn(T, V, generator=g)
    return dict(conf=conf, drafts=drafts, context=context, block_table=block_table, anchors=anchors,
                draft_tokens=draft_tokens, k_cache=k_cache, v_cache=v_cache, q=q, k_new=k_new, v_new=v_new,
                logits=logits)


def test_whole_verification_step_compiles_fullgraph():
    """survival -> plan -> write_kv -> verify_attention -> rejection_sample under torch.compile(fullgraph=True)
    (every op is a custom op with a fake implementation, so nothing breaks the graph) equals eager."""
    table = av.CostTable.from_points({1: 1.0, 64: 1.5}, draft_ms=0.5)
    K = 4

    def step(x):
        survival = av.prefix_survival(x["conf"], x["drafts"])
        plan = av.plan_verification(survival, x["drafts"], table, mode="greedy", context_lens=x["context"],
                                    block_table=x["block_table"], block_size=16, anchor_tokens=x["anchors"],
                                    draft_tokens=x["draft_tokens"], num_tokens_padded=x["q"].shape[0])
        av.write_kv(x["k_new"], x["v_new"], x["k_cache"], x["v_cache"], plan.slot_mapping)
        attn = av.verify_attention(x["q"], x["k_cache"], x["v_cache"], x["block_table"], plan.seq_lens,
                                   plan.query_start_loc, K + 1)
        tokens, emitted = av.rejection_sample(x["logits"] + attn.float().mean(), plan.query_start_loc,
                                              x["draft_tokens"], temperature=torch.ones(3),
                                              seeds=torch.arange(3, dtype=torch.int64), offset=3)
        return survival, plan.verify_lens, plan.slot_mapping, attn, tokens, emitted, x["k_cache"]

    eager = step(_step_inputs())
    dynamo.reset()
    compiled = torch.compile(step, fullgraph=True)(_step_inputs())
    for name, e, c in zip(("survival", "verify_lens", "slot_mapping", "attention", "tokens", "emitted", "k_cache"),
                          eager, compiled):
        assert e.dtype == c.dtype and torch.equal(e, c), name
    assert int(eager[1].sum()) > 0  # the step verifies something


def _attention_op_args():
    x = _step_inputs()
    R = 3
    qsl = torch.tensor([0, 5, 8, 12], dtype=torch.int32)
    seq = torch.tensor([10, 20, 4], dtype=torch.int32)
    out = torch.empty_like(x["q"])
    lse = torch.empty(x["q"].shape[:2], dtype=torch.float32)
    err = torch.zeros(av.errors.error_buffer("cpu").numel(), dtype=torch.int32)
    return (x["q"], x["k_cache"], x["v_cache"], x["block_table"][:R].contiguous(), seq, qsl, out, lse, err, 5, 4, 0.125,
            0), x


def test_opcheck_verify_attention_and_write_kv():
    args, x = _attention_op_args()
    torch.library.opcheck(torch.ops.adaptive_verify.verify_attention_into.default, args)
    # with a draft-tree mask ([T] int64; request 0 a star: every node under the anchor)
    mask = torch.zeros(args[0].shape[0], dtype=torch.int64)  # padding tokens' entries are never read
    mask[:12] = torch.tensor([1, 3, 5, 9, 17, 1, 3, 7, 1, 3, 5, 11])
    torch.library.opcheck(torch.ops.adaptive_verify.verify_attention_into.default, args + (mask,))
    slots = torch.arange(x["k_new"].shape[0], dtype=torch.int64)
    err = torch.zeros(av.errors.error_buffer("cpu").numel(), dtype=torch.int32)
    torch.library.opcheck(torch.ops.adaptive_verify.write_kv_.default,
                          (x["k_new"], x["v_new"], x["k_cache"], x["v_cache"], slots, err))
