"""Engine adapters (adaptive_verify.integrations.vllm / .sglang) against slow references computed by hand
from the plan's per-request verify lengths, with stand-in classes shaped like vLLM's and SGLang's. The same
adapters against the real vLLM and SGLang packages: tests/integration/ (after tests/integration/install_peers.sh)."""
import subprocess
import sys
from dataclasses import dataclass
from typing import Optional

import numpy as np
import pytest
import torch

import adaptive_verify as av
from adaptive_verify.integrations import sglang as avs
from adaptive_verify.integrations import vllm as avv

K = 5
BLOCK = 4


# Stand-ins with the fields of vLLM v1's classes (vllm/v1/spec_decode/metadata.py, the version with
# cu_num_sampled_tokens; an older one without it; CommonAttentionMetadata's core fields).
@dataclass
class SpecDecodeMetadata:
    draft_token_ids: torch.Tensor
    num_draft_tokens: list
    cu_num_draft_tokens: torch.Tensor
    cu_num_sampled_tokens: torch.Tensor
    target_logits_indices: torch.Tensor
    bonus_logits_indices: torch.Tensor
    logits_indices: torch.Tensor

    def __post_init__(self):
        self.max_spec_len = max(self.num_draft_tokens)


@dataclass
class OldSpecDecodeMetadata:
    draft_token_ids: torch.Tensor
    num_draft_tokens: list
    cu_num_draft_tokens: torch.Tensor
    target_logits_indices: torch.Tensor
    bonus_logits_indices: torch.Tensor
    logits_indices: torch.Tensor


@dataclass
class CommonAttentionMetadata:
    query_start_loc: torch.Tensor
    seq_lens: torch.Tensor
    num_reqs: int
    num_actual_tokens: int
    max_query_len: int
    max_seq_len: int
    block_table_tensor: torch.Tensor
    slot_mapping: torch.Tensor
    causal: bool = True


def make_step(seed, R, *, budget=None, R_pad=None, token_offset=0, T_pad=None):
    """A random CPU plan with every metadata output, and its inputs."""
    rng = np.random.default_rng(seed)
    conf = torch.empty(R, K)  # filled by copy: torch.tensor / from_numpy of an empty array give strides (0, 0)
    conf.copy_(torch.from_numpy(rng.uniform(0.05, 0.99, (R, K)).astype(np.float32)))
    drafts_l = [list(rng.integers(0, 1000, rng.integers(0, K + 1))) for _ in range(R)]
    drafts_l = [[int(x) for x in d] for d in drafts_l]
    draft_tokens, drafts = avv.drafts_from_vllm(drafts_l, K)
    ctx = torch.from_numpy(rng.integers(1, 30, R).astype(np.int32))
    max_blocks = (30 + K + 1) // BLOCK + 1
    bt = torch.from_numpy(rng.permutation(R * max_blocks).reshape(R, max_blocks).astype(np.int32)) \
        if R else torch.zeros(0, max_blocks, dtype=torch.int32)
    anchors = torch.from_numpy(rng.integers(0, 1000, R).astype(np.int32))
    survival = av.prefix_survival(conf, drafts)
    if budget is None:
        budget = int(rng.integers(0, int(drafts.sum()) + 1)) if R else 0
    plan = av.plan_verification(survival, drafts, mode="fixed", budget=budget, context_lens=ctx, block_table=bt,
                                block_size=BLOCK, anchor_tokens=anchors, draft_tokens=draft_tokens,
                                token_offset=token_offset, num_reqs_padded=R_pad, num_tokens_padded=T_pad)
    return dict(plan=plan, drafts_l=drafts_l, draft_tokens=draft_tokens, drafts=drafts, ctx=ctx, bt=bt,
                anchors=anchors, R=R)


def ref_spec(vl, token_offset=0):
    """vLLM's SpecDecodeMetadata index fields, the slow way, from per-request verify lengths."""
    qsl = [0]
    for L in vl:
        qsl.append(qsl[-1] + 1 + L)
    target = [qsl[r] + j for r, L in enumerate(vl) for j in range(L)]
    bonus = [qsl[r] + L for r, L in enumerate(vl)]
    cu = list(np.cumsum(vl)) if vl else []
    cu_s = list(np.cumsum([L + 1 for L in vl])) if vl else []
    logits = [token_offset + i for i in range(qsl[-1])]
    return dict(target=target, bonus=bonus, cu=[int(x) for x in cu], cu_s=[int(x) for x in cu_s], logits=logits)


CASES = [
    dict(seed=0, R=6),
    dict(seed=1, R=9, budget=0),
    dict(seed=2, R=7, budget=10 ** 6),  # clamped: every draft
    dict(seed=3, R=5, R_pad=8, token_offset=11),
    dict(seed=4, R=12, T_pad=64),
    dict(seed=5, R=1),
]


@pytest.mark.parametrize("case", CASES)
def test_vllm_spec_decode_metadata_matches_reference(case):
    s = make_step(**case)
    plan, R = s["plan"], s["R"]
    vl = plan.verify_lens[:R].tolist()
    d = avv.spec_decode_metadata(plan, s["draft_tokens"], R)
    ref = ref_spec(vl, case.get("token_offset", 0))
    assert d["num_draft_tokens"] == vl
    assert d["cu_num_draft_tokens"].tolist() == ref["cu"]
    assert d["cu_num_sampled_tokens"].tolist() == ref["cu_s"]
    assert d["target_logits_indices"].tolist() == ref["target"]
    assert d["bonus_logits_indices"].tolist() == ref["bonus"]
    assert d["logits_indices"].tolist() == ref["logits"]
    assert d["draft_token_ids"].tolist() == [x for r in range(R) for x in s["drafts_l"][r][: vl[r]]]
    for k in ("draft_token_ids", "cu_num_draft_tokens", "target_logits_indices", "bonus_logits_indices",
              "logits_indices"):
        assert d[k].dtype == torch.int32
    # The plan's own layout agrees: logits_indices are the decode tokens, whose input ids at the target rows
    # + 1 are the drafts (how vLLM's model runner reads draft ids out of input_ids).
    qsl = plan.query_start_loc[: R + 1].tolist()
    assert d["logits_indices"].tolist() == list(range(qsl[0], qsl[-1]))
    ids = plan.input_ids[: qsl[-1] - qsl[0]]
    assert ids[d["target_logits_indices"].long() + 1].tolist() == d["draft_token_ids"].tolist()
    # Stand-ins build from the dict; the older class without cu_num_sampled_tokens through build().
    if R:
        m = SpecDecodeMetadata(**d)
        assert m.max_spec_len == max(vl)
    old = avv.build(OldSpecDecodeMetadata, d)
    assert old.num_draft_tokens == vl
    # A host copy of verify_lens given by the caller gives the same result.
    d2 = avv.spec_decode_metadata(plan, s["draft_tokens"], R, verify_lens_host=np.array(vl))
    assert all(torch.equal(d[k], d2[k]) for k in d if isinstance(d[k], torch.Tensor))


@pytest.mark.parametrize("case", CASES)
def test_vllm_attention_metadata(case):
    s = make_step(**case)
    plan, R = s["plan"], s["R"]
    vl = plan.verify_lens[:R].tolist()
    d = avv.attention_metadata(plan, s["bt"], 1 + K, R)
    m = CommonAttentionMetadata(**d)
    qsl = [case.get("token_offset", 0)]
    for L in vl:
        qsl.append(qsl[-1] + 1 + L)
    assert m.query_start_loc.tolist() == qsl
    seq = [int(c) + 1 + L for c, L in zip(s["ctx"].tolist(), vl)]
    assert m.seq_lens.tolist() == seq
    assert m.num_reqs == R and m.max_query_len == 1 + K and m.causal is True
    assert m.max_seq_len == (max(seq) if seq else 0)
    assert m.num_actual_tokens == plan.token_req.numel()
    assert torch.equal(m.block_table_tensor, s["bt"][:R])
    # slot_mapping by hand: request r's token i at position ctx + i; padding -1 (vLLM's PAD_SLOT_ID)
    slots = []
    for r, L in enumerate(vl):
        for i in range(1 + L):
            p = int(s["ctx"][r]) + i
            slots.append(int(s["bt"][r, p // BLOCK]) * BLOCK + p % BLOCK)
    T = plan.token_req.numel()
    assert m.slot_mapping.tolist() == slots + [avv.PAD_SLOT_ID] * (T - len(slots))
    h = avv.attention_metadata(plan, s["bt"], 1 + K, R, max_seq_len=99, num_actual_tokens=len(slots),
                               host_copies=True)
    assert h["max_seq_len"] == 99 and h["num_actual_tokens"] == len(slots)
    assert h["query_start_loc_cpu"].tolist() == qsl and h["seq_lens_cpu"].tolist() == seq


def test_vllm_padding_rows_are_excluded():
    s = make_step(seed=7, R=5, R_pad=8, T_pad=48)
    plan = s["plan"]
    assert plan.verify_lens.shape[0] == 8
    d = avv.spec_decode_metadata(plan, s["draft_tokens"], 5)
    assert len(d["num_draft_tokens"]) == 5 and d["bonus_logits_indices"].shape == (5,)
    a = avv.attention_metadata(plan, s["bt"], 1 + K, 5)
    assert a["query_start_loc"].shape == (6,) and a["seq_lens"].shape == (5,)
    # Padding rows of the plan are q_len 0 rows: with num_reqs omitted the draft tokens table is too short.
    with pytest.raises(ValueError, match="draft_tokens"):
        avv.spec_decode_metadata(plan, s["draft_tokens"])


def test_vllm_zero_requests():
    s = make_step(seed=8, R=0)
    plan = s["plan"]
    d = avv.spec_decode_metadata(plan, s["draft_tokens"])
    assert d["num_draft_tokens"] == [] and d["draft_token_ids"].numel() == 0
    assert d["logits_indices"].numel() == 0 and d["bonus_logits_indices"].numel() == 0
    a = avv.attention_metadata(plan, s["bt"], 1)
    assert a["num_reqs"] == 0 and a["query_start_loc"].tolist() == [0] and a["max_seq_len"] == 0
    assert avv.drafts_from_vllm([], K)[0].shape == (0, K)
    assert avv.sampled_token_ids(torch.zeros(0, K + 1, dtype=torch.int32), torch.zeros(0, dtype=torch.int32)) == []
    o = avs.verify_input(plan, K)
    assert o["qo_indptr"].tolist() == [0] and o["retrieve_index"].shape == (0, K + 1)


def test_vllm_drafts_round_trip_and_tensor_input():
    lists = [[5, 6, 7], [], [1], [9, 8, 7, 6, 5]]
    tokens, drafts = avv.drafts_from_vllm(lists, K)
    assert tokens.shape == (4, K) and tokens.dtype == torch.int32 and drafts.tolist() == [3, 0, 1, 5]
    assert tokens[0, 3:].tolist() == [0, 0]
    assert avv.drafts_to_vllm(tokens, drafts) == lists
    # A proposer-style tensor [R, k] with -1 padding (anything after the first negative id is ignored).
    t = torch.tensor([[5, 6, 7], [-1, 3, 3], [1, -1, 4], [2, 2, 2]])
    tokens2, drafts2 = avv.drafts_from_vllm(t, K)
    assert drafts2.tolist() == [3, 0, 1, 3]
    assert avv.drafts_to_vllm(tokens2, drafts2) == [[5, 6, 7], [], [1], [2, 2, 2]]
    assert tokens2[1].tolist() == [0] * K


def test_vllm_sampled_token_ids_from_rejection_sample():
    s = make_step(seed=9, R=6, R_pad=7, token_offset=5)
    plan, R = s["plan"], s["R"]
    d = avv.spec_decode_metadata(plan, s["draft_tokens"], R)
    n = d["logits_indices"].numel()
    g = torch.Generator().manual_seed(0)
    hidden_logits = torch.randn(plan.token_req.numel() + 5, 50, generator=g)  # rows for every token index
    logits = hidden_logits[d["logits_indices"].long()]  # vLLM computes logits only at logits_indices
    qsl = avv.sampler_query_start_loc(plan, R)
    assert qsl.tolist()[-1] == n and qsl.tolist()[0] == 0
    dt = s["draft_tokens"] % 50
    out, emitted = av.rejection_sample(logits, qsl, dt, temperature=torch.ones(R), seeds=torch.arange(R))
    lists = avv.sampled_token_ids(out, emitted)
    vl = d["num_draft_tokens"]
    for r in range(R):
        e = int(emitted[r])
        assert 1 <= e <= vl[r] + 1
        assert lists[r] == out[r, :e].tolist()
        assert lists[r][:-1] == dt[r, : e - 1].tolist()  # accepted drafts, then one more token
    # vLLM's tensor shape [R, max_spec_len + 1] keeps every emitted token; parse_output-style filtering.
    t = avv.output_token_ids(out, max(vl))
    assert t.shape == (R, max(vl) + 1)
    assert [[x for x in row if x != avv.PLACEHOLDER_TOKEN_ID] for row in t.tolist()] == lists
    assert avv.sampled_token_ids(out, emitted, vocab_size=1) == [[x for x in row if x < 1] for row in lists]
    # Greedy with the target's argmax as drafts accepts every verified draft.
    greedy = torch.zeros(R, K, dtype=torch.int32)
    starts = qsl.tolist()
    for r in range(R):
        for j in range(vl[r]):
            greedy[r, j] = int(logits[starts[r] + j].argmax())
    out, emitted = av.rejection_sample(logits, qsl, greedy)
    assert (emitted.tolist()) == [L + 1 for L in vl]


def test_vllm_bad_inputs_name_the_argument():
    s = make_step(seed=10, R=4)
    plan = s["plan"]
    with pytest.raises(ValueError, match="max_drafts"):
        avv.drafts_from_vllm([[1]], 0)
    with pytest.raises(ValueError, match=r"draft_token_ids\[1\]"):
        avv.drafts_from_vllm([[1], [1] * (K + 1)], K)
    with pytest.raises(ValueError, match=r"draft_token_ids\[0\]"):
        avv.drafts_from_vllm([[-3]], K)
    with pytest.raises(ValueError, match="draft_token_ids"):
        avv.drafts_from_vllm("abc", K)
    with pytest.raises(ValueError, match="draft_token_ids"):
        avv.drafts_from_vllm(torch.zeros(2, K + 1, dtype=torch.int64), K)
    with pytest.raises(ValueError, match="drafts"):
        avv.drafts_to_vllm(s["draft_tokens"], [1, 2])
    with pytest.raises(ValueError, match="num_reqs"):
        avv.spec_decode_metadata(plan, s["draft_tokens"], 5)
    with pytest.raises(ValueError, match="draft_tokens"):
        avv.spec_decode_metadata(plan, s["draft_tokens"][:, :1].float())
    with pytest.raises(ValueError, match="verify_lens_host"):
        avv.spec_decode_metadata(plan, s["draft_tokens"], verify_lens_host=[1, 2])
    with pytest.raises(ValueError, match="max_query_len"):
        avv.attention_metadata(plan, s["bt"], 0)
    with pytest.raises(ValueError, match="block_table"):
        avv.attention_metadata(plan, s["bt"][:2], 1 + K)
    bare = av.plan_verification(av.prefix_survival(torch.full((2, K), 0.5), torch.full((2,), K, dtype=torch.int32)),
                                torch.full((2,), K, dtype=torch.int32), mode="all")
    with pytest.raises(ValueError, match="plan.seq_lens"):
        avv.attention_metadata(bare, s["bt"][:2], 1 + K)
    with pytest.raises(ValueError, match="plan.seq_lens"):
        avs.verify_input(bare, K)
    no_ids = av.plan_verification(av.prefix_survival(torch.full((2, K), 0.5), torch.full((2,), K, dtype=torch.int32)),
                                  torch.full((2,), K, dtype=torch.int32), mode="all", context_lens=s["ctx"][:2])
    with pytest.raises(ValueError, match="plan.input_ids"):
        avs.verify_input(no_ids, K)
    with pytest.raises(ValueError, match="num_emitted"):
        avv.sampled_token_ids(torch.zeros(3, K + 1, dtype=torch.int32), torch.zeros(2, dtype=torch.int32))
    with pytest.raises(ValueError, match="max_spec_len"):
        avv.output_token_ids(torch.zeros(3, K + 1, dtype=torch.int32), K + 1)


# --------------------------------------------------------------------------------------------------
# SGLang (chain, topk = 1)
# --------------------------------------------------------------------------------------------------


@dataclass
class EagleVerifyOutput:  # the fields of SGLang's class that are ours to fill
    verified_id: torch.Tensor
    accept_length_per_req_cpu: list
    accepted_indices: torch.Tensor
    draft_input: Optional[object] = None
    logits_output: Optional[object] = None


@pytest.mark.parametrize("case", CASES)
def test_sglang_verify_input_matches_reference(case):
    s = make_step(**case)
    plan, R = s["plan"], s["R"]
    vl = plan.verify_lens[:R].tolist()
    d = avs.verify_input(plan, K, R)
    ctx = s["ctx"].tolist()
    qo = [0]
    for L in vl:
        qo.append(qo[-1] + 1 + L)
    assert d["qo_indptr"].tolist() == qo
    assert d["seq_lens"].tolist() == ctx
    assert d["end_offset"].tolist() == [c + 1 + L for c, L in zip(ctx, vl)]
    assert d["kv_indptr"].tolist() == [int(x) for x in np.cumsum([0] + d["end_offset"].tolist())]
    assert d["verify_lens"].tolist() == vl and d["topk"] == 1
    toks, pos = [], []
    for r, L in enumerate(vl):
        toks += [int(s["anchors"][r])] + s["drafts_l"][r][:L]
        pos += [ctx[r] + i for i in range(1 + L)]
    n = len(toks)
    assert d["draft_token"][:n].tolist() == toks and d["draft_token"].dtype == torch.int64
    assert d["positions"][:n].tolist() == pos and d["positions"].dtype == torch.int64
    for r, L in enumerate(vl):
        assert d["retrieve_index"][r].tolist() == [qo[r] + j if j <= L else -1 for j in range(K + 1)]
        assert d["retrieve_next_token"][r].tolist() == [j + 1 if j < L else -1 for j in range(K + 1)]
    assert (d["retrieve_next_sibling"] == -1).all()
    d2 = avs.verify_input(plan, K, R, num_tokens=n)
    assert d2["draft_token"].tolist() == toks


def test_sglang_uniform_case_matches_sglang_layout():
    """Every draft verified: our tokens are SGLang's topk = 1 layout (anchor then the drafts, uniform)."""
    R, steps = 4, 3
    rng = np.random.default_rng(11)
    sg = torch.from_numpy(rng.integers(0, 1000, R * (steps + 1)))  # SGLang's draft_token, flattened
    anchors, draft_tokens, drafts = avs.chain_from_sglang(sg, R)
    assert drafts.tolist() == [steps] * R and anchors.tolist() == sg[:: steps + 1].tolist()
    ctx = torch.tensor([3, 9, 1, 20], dtype=torch.int32)
    plan = av.plan_verification(av.prefix_survival(torch.full((R, steps), 0.7), drafts), drafts, mode="all",
                                context_lens=ctx, anchor_tokens=anchors, draft_tokens=draft_tokens)
    d = avs.verify_input(plan, steps, R)
    assert torch.equal(d["draft_token"], sg.to(torch.int64))
    assert d["qo_indptr"].tolist() == list(range(0, (R + 1) * (steps + 1), steps + 1))
    assert d["positions"].tolist() == [c + j for c in ctx.tolist() for j in range(steps + 1)]
    assert d["retrieve_index"].tolist() == [[b * (steps + 1) + j for j in range(steps + 1)] for b in range(R)]
    with pytest.raises(ValueError, match="draft_token"):
        avs.chain_from_sglang(sg[:-1], R)
    with pytest.raises(ValueError, match="num_reqs"):
        avs.chain_from_sglang(sg, -1)


def test_sglang_verify_output():
    s = make_step(seed=12, R=6, R_pad=9, token_offset=3)
    plan, R = s["plan"], s["R"]
    vl = plan.verify_lens[:R].tolist()
    qo = avv.sampler_query_start_loc(plan, R)
    T = int(qo[-1])
    logits = torch.randn(T, 40, generator=torch.Generator().manual_seed(1))
    out, emitted = av.rejection_sample(logits, qo, s["draft_tokens"] % 40, temperature=torch.ones(R),
                                       seeds=torch.arange(R))
    d = avs.verify_output(plan, out, emitted, R)
    em = emitted.tolist()
    assert d["accept_length"].tolist() == [e - 1 for e in em]
    assert d["accept_length_per_req_cpu"] == [e - 1 for e in em]
    starts = qo.tolist()
    for r in range(R):
        assert d["accept_index"][r].tolist() == [starts[r] + j if j < em[r] else -1 for j in range(K + 1)]
        assert em[r] <= vl[r] + 1
    assert d["verified_id"].tolist() == [t for r in range(R) for t in out[r, : em[r]].tolist()]
    assert d["accepted_rows"].tolist() == [starts[r] + j for r in range(R) for j in range(em[r])]
    o = EagleVerifyOutput(verified_id=d["verified_id"], accept_length_per_req_cpu=d["accept_length_per_req_cpu"],
                          accepted_indices=d["accept_index"])
    assert o.accepted_indices.dtype == torch.int32
    dev_only = avs.verify_output(plan, out, emitted, R, host=False)
    assert set(dev_only) == {"accept_length", "accept_index"}
    with pytest.raises(ValueError, match="num_emitted"):
        avs.verify_output(plan, out, emitted[:3], 3)
    with pytest.raises(ValueError, match="max_drafts"):
        avs.verify_input(plan, 0)
    with pytest.raises(ValueError, match="num_tokens"):
        avs.verify_input(plan, K, num_tokens=10 ** 6)


def test_verifier_plan_feeds_the_adapters():
    """AdaptiveVerifier's lagged loop with the adapters: the host budget is R + B tokens, the spec-decode
    metadata covers exactly the budget, and observe() takes the sampler's counts."""
    ct = av.CostTable.from_points({1: 4.0, 16: 4.2, 64: 5.0, 256: 9.0}, draft_ms=0.5, graph_sizes=[8, 16, 32, 64],
                                  max_tokens=256)
    v = av.AdaptiveVerifier(ct, max_reqs=8, max_drafts=K, block_size=BLOCK)
    rng = np.random.default_rng(13)
    for step in range(3):
        R = 6
        lists = [[int(x) for x in rng.integers(0, 60, rng.integers(0, K + 1))] for _ in range(R)]
        draft_tokens, drafts = avv.drafts_from_vllm(lists, K)
        budget, padded = v.plan_budget(R, [len(x) for x in lists])
        conf = torch.from_numpy(rng.uniform(0.1, 0.95, (R, K)).astype(np.float32))
        v.record_confidence(conf)
        ctx = torch.full((R,), 10, dtype=torch.int32)
        bt = torch.arange(R * 8, dtype=torch.int32).reshape(R, 8)
        plan = v.plan(conf, drafts, ctx, bt, torch.zeros(R, dtype=torch.int32), draft_tokens, budget)
        assert plan.token_req.numel() == padded  # the graph size the scheduler reserved for
        d = avv.spec_decode_metadata(plan, draft_tokens, R)
        assert sum(d["num_draft_tokens"]) == budget == int(plan.budget)
        assert d["logits_indices"].numel() == R + budget
        logits = torch.randn(R + budget, 60)
        out, emitted = av.rejection_sample(logits, avv.sampler_query_start_loc(plan, R), draft_tokens)
        v.observe(plan.verify_lens, emitted - 1)
        assert len(avv.sampled_token_ids(out, emitted)) == R
    assert v.metrics()["steps"] == 3


def test_adapters_import_no_engine():
    """Importing the library and both adapters imports neither engine (nor triton), installed or not."""
    code = ("import sys, adaptive_verify, adaptive_verify.integrations.vllm, adaptive_verify.integrations.sglang; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('vllm', 'sglang', 'triton')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    assert out.stdout.strip() == "[]", out.stdout
