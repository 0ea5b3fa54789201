"""This library's budget, allocation and cost tables against the installed vLLM's adaptive verification, on
thousands of random batches (vllm_differential.py is the harness; docs/integrations/vllm.md has the counts)."""
import collections

import numpy as np
import pytest
import torch

import adaptive_verify as av
import vllm_differential as vd
from adaptive_verify.integrations import vllm as avv
from peers import import_peer, require_peers

require_peers("vllm")

BATCHES = 2400  # ~10 s on 2 cores after the import


@pytest.fixture(scope="module")
def vllm_av():
    return import_peer("vllm.v1.worker.gpu.spec_decode.adaptive_verification")


@pytest.fixture(scope="module")
def result(vllm_av):
    counts, examples, cfgs = vd.run(vllm_av, BATCHES, seed=1)
    return counts, examples, cfgs


def classes(counts, level, kinds, prefill):
    out = collections.Counter()
    for (lv, kind, pf), c in counts.items():
        if lv == level and kind in kinds and pf in prefill:
            out.update(c)
    return out


def test_every_disagreement_has_a_documented_class(result):
    counts, examples, _ = result
    total = collections.Counter()
    for c in counts.values():
        total.update(c)
    assert sum(total.values()) >= 2 * BATCHES
    bad = {k: v for k, v in examples.items() if "unexplained" in k[1]}
    assert not bad, f"disagreements no class explains: {bad}"
    for cls in total:
        for part in cls.split("+"):
            assert part in vd.CLASSES, cls


@pytest.mark.parametrize("level", ["budget/dense", "budget/curves"])
def test_budget_agrees_where_semantics_agree(result, level):
    """Decode-only steps with confidences in [0, 1] (continuous, quantised, new requests at the prior): the
    same budget as vLLM, up to float rounding of a near-tie of Theta. With prompt chunks, the one semantic
    difference is the numerator (a chunk that does not finish counts here)."""
    counts = result[0]
    plain = classes(counts, level, {"continuous", "quantised", "joining"}, {False})
    assert plain["agree"] >= 0.99 * sum(plain.values()) and set(plain) <= {"agree", "rounding"}, plain
    mixed = classes(counts, level, {"continuous", "quantised", "joining"}, {True})
    assert set(mixed) <= {"agree", "rounding", "prefill_not_sampling"}, mixed
    assert mixed["agree"] >= 0.95 * sum(mixed.values()), mixed


def test_allocation_agrees_where_semantics_agree(result):
    """At vLLM's budget: the same verify lengths as vLLM's _assign_draft_token_budget; equal survivals at the
    budget's edge (quantised confidences, new requests at 1.0) may go to other requests (tie order), with the
    same survivals taken."""
    counts = result[0]
    cont = classes(counts, "allocation", {"continuous"}, {False, True})
    assert set(cont) <= {"agree", "tie_order"} and cont["agree"] >= 0.99 * sum(cont.values()), cont
    ties = classes(counts, "allocation", {"quantised", "joining"}, {False, True})
    assert set(ties) <= {"agree", "tie_order"} and ties["tie_order"] > 0, ties


@pytest.mark.parametrize("kind", sorted(vd.EDGE))
def test_edge_values_are_the_only_cause(result, kind):
    """Confidences outside [0, 1] or NaN: every disagreement goes away when vLLM is given the values as this
    library reads them (clamped, NaN as 0), apart from ties among the zeros that creates."""
    counts = result[0]
    for level in ("budget/dense", "allocation"):
        c = classes(counts, level, {kind}, {False, True})
        causes = {part for cls in c if cls != "agree" for part in cls.split("+")}
        assert causes <= {kind, "tie_order", "prefill_not_sampling"}, (level, c)
        assert c[kind] + c[f"{kind}+tie_order"] + c[f"{kind}+prefill_not_sampling"] > 0, (level, c)


def test_cost_tables_equal_vllms(result):
    """Our CostTable from vLLM's profiled curves costs every token count exactly as vLLM's
    build_cost_tables_from_curves (graph staircase, eager tail, extrapolation, envelope); the drafter only
    differs between points measured past the token graph limit, where vLLM interpolates."""
    diffs = vd.table_differences(result[2])
    assert diffs["verify counts different"] == 0 and diffs["verify counts equal"] > 0, diffs
    assert diffs["draft counts different"] == diffs["draft counts different past the graph limit"], diffs


def test_nan_and_above_one_by_hand(vllm_av):
    """The two vLLM behaviours behind the edge classes, on a batch small enough to read."""
    cfg = vd.make_config(np.random.default_rng(3), vllm_av)
    K = cfg.K
    stale = np.full((2, K), 0.9, dtype=np.float32)
    stale[0, 0] = np.nan
    step = vd.Step(req_ids=["a", "b"], drafts=np.full(2, K, dtype=np.int32), non_draft=np.ones(2, dtype=np.int64),
                   sampling=np.ones(2, dtype=bool), stale=stale, live=stale, max_total_logits=10 ** 6, kind="nan",
                   prefill=False)
    # vLLM sorts the NaN survival first; the NaN spreads through its cumsum and np.argmax returns the first NaN.
    assert vd.vllm_budget(vllm_av, cfg, step) == 1
    assert vd.our_budget(cfg.ours_dense, step) == vd.vllm_budget(vllm_av, cfg, vd.sanitised(step, "stale"))
    # Confidence above 1: vLLM's survival grows along the row and topk takes the later draft, then counts it
    # as a prefix; here it is clamped to 1, so the first draft ranks first.
    live = np.array([[0.5, 1.8], [0.6, 0.1]], dtype=np.float32)
    s2 = vd.Step(req_ids=["a", "b"], drafts=np.array([2, 2], dtype=np.int32), non_draft=np.ones(2, dtype=np.int64),
                 sampling=np.ones(2, dtype=bool), stale=live, live=live, max_total_logits=100, kind="above_one",
                 prefill=False)
    assert vd.vllm_allocation(vllm_av, s2, 1) == [1, 0]  # 0.5 * 1.8 = 0.9 beats 0.6: request a's draft 1 "wins"
    assert vd.our_allocation(s2, 1) == [0, 1]  # clamped: a's survivals 0.5, 0.5; b's 0.6 ranks first
    assert avv.budget_kwargs(2, 2, 100) == {"extra_tokens": 0, "capacity": 100}


def test_budget_kwargs_logit_capacity(vllm_av):
    """vLLM caps the draft budget by logit rows (max_total_logits - R * bonus); budget_kwargs turns that into
    the planner's token capacity, so both stop at the same count when every draft is worth verifying."""
    cfg = vd.make_config(np.random.default_rng(4), vllm_av)
    R, K = 6, cfg.K
    ones = np.ones((R, K), dtype=np.float32)
    for cap_logits in (R, R + 1, R + 3, R + R * K, 10 ** 6):
        step = vd.Step(req_ids=[f"r{i}" for i in range(R)], drafts=np.full(R, K, dtype=np.int32),
                       non_draft=np.ones(R, dtype=np.int64), sampling=np.ones(R, dtype=bool), stale=ones, live=ones,
                       max_total_logits=cap_logits, kind="continuous", prefill=False)
        theirs = vd.vllm_budget(vllm_av, cfg, step)
        assert vd.our_budget(cfg.ours_dense, step) == theirs <= max(0, cap_logits - R)
    with pytest.raises(ValueError, match="num_non_draft_tokens"):
        avv.budget_kwargs(4, 3, 10)
    with pytest.raises(ValueError, match="max_tokens"):
        avv.budget_kwargs(4, 8, 10, max_tokens=7)


def test_cost_table_from_vllm(vllm_av):
    cfg = vd.make_config(np.random.default_rng(5), vllm_av)
    dt, vt = cfg.tables
    t = avv.cost_table_from_vllm(cfg.tables)
    assert t.max_tokens == vt.shape[0] - 1
    assert all(t.verify_cost(n) == vt[n] for n in range(1, vt.shape[0]))
    assert all(t.draft_cost(r) == dt[r] for r in range(1, dt.shape[0]))
    assert torch.equal(t.verify_array(t.max_tokens)[1:], torch.from_numpy(vt[1:]).float())
    with pytest.raises(ValueError, match="cost_tables"):
        avv.cost_table_from_vllm(vt)
    with pytest.raises(ValueError, match="cost_tables"):
        avv.cost_table_from_vllm((dt, -vt))
    assert isinstance(t, av.CostTable)
