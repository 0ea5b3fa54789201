"""adaptive_verify.integrations.vllm against the installed vLLM's own classes and functions (CPU).

Each test builds the real vLLM object from the adapter's output and runs vLLM's own code on it (its
``__post_init__``, methods, and the model runner's metadata computation), so a field the adapter gets wrong
shows up as a disagreement with vLLM, not with our reading of vLLM.
"""
import types

import numpy as np
import pytest
import torch

import adaptive_verify as av
from adaptive_verify.integrations import vllm as avv
from peers import import_peer, require_peers, vllm_on_cpu
from steps import CASES, VOCAB, make_step

require_peers("vllm")


@pytest.fixture(scope="module")
def vllm():
    with pytest.MonkeyPatch.context() as mp:
        ns = types.SimpleNamespace(
            metadata=import_peer("vllm.v1.spec_decode.metadata"),
            backend=import_peer("vllm.v1.attention.backend"),
            sampler=import_peer("vllm.v1.sample.rejection_sampler"),
            outputs=import_peer("vllm.v1.outputs"),
            runner=import_peer("vllm.v1.worker.gpu_model_runner"),
        )
        vllm_on_cpu(mp)
        yield ns


def vllm_runner_metadata(vllm, num_draft_tokens, cu_num_scheduled_tokens, input_ids):
    """vLLM's GPUModelRunner._calc_spec_decode_metadata run on the CPU: the method's own code, bound to an
    object holding just the attributes it reads (its arange buffers, device, and the input_ids buffer)."""
    runner_cls = vllm.runner.GPUModelRunner
    n = int(cu_num_scheduled_tokens[-1]) + 8
    fake = types.SimpleNamespace(arange_np=np.arange(n, dtype=np.int64), _arange_scratch=np.empty(n, dtype=np.int64),
                                 device=torch.device("cpu"), input_ids=types.SimpleNamespace(gpu=input_ids))
    fake._get_cumsum_and_arange = types.MethodType(runner_cls._get_cumsum_and_arange, fake)
    return runner_cls._calc_spec_decode_metadata(fake, np.asarray(num_draft_tokens, dtype=np.int32),
                                                 np.asarray(cu_num_scheduled_tokens, dtype=np.int32))


FIELDS = ("draft_token_ids", "cu_num_draft_tokens", "cu_num_sampled_tokens", "target_logits_indices",
          "bonus_logits_indices", "logits_indices")


@pytest.mark.parametrize("case", [c for c in CASES if c.get("token_offset", 0) == 0], ids=lambda c: f"seed{c['seed']}")
def test_spec_decode_metadata_equals_vllm_runner(vllm, case):
    """Our SpecDecodeMetadata fields == what vLLM's model runner computes for the same verify lengths and
    token buffer (decode-only step), field for field; the real dataclass builds and its __post_init__ runs."""
    s = make_step(**case)
    plan, R = s["plan"], s["R"]
    vl = plan.verify_lens[:R].tolist()
    ours = avv.build(vllm.metadata.SpecDecodeMetadata, avv.spec_decode_metadata(plan, s["draft_tokens"], R))
    theirs = vllm_runner_metadata(vllm, vl, np.cumsum([1 + L for L in vl]), plan.input_ids)
    assert ours.num_draft_tokens == theirs.num_draft_tokens == vl
    assert ours.max_spec_len == theirs.max_spec_len == max(vl)  # set by vLLM's __post_init__
    for f in FIELDS:
        a, b = getattr(ours, f), getattr(theirs, f)
        assert a.tolist() == b.tolist(), f
        assert a.dtype == torch.int32, f
    # vLLM's own dummy builder agrees on the cumulative counts and the draft ids it is given.
    dummy = vllm.metadata.SpecDecodeMetadata.make_dummy(
        [s["drafts_l"][r][: vl[r]] for r in range(R)], torch.device("cpu"))
    for f in ("draft_token_ids", "cu_num_draft_tokens", "cu_num_sampled_tokens"):
        assert getattr(ours, f).tolist() == getattr(dummy, f).tolist(), f


def test_spec_decode_metadata_after_prefill_rows(vllm):
    """A mixed step, as docs/integrations/vllm.md describes it: prefill requests first (token_offset = their
    tokens, one logit row each when they finish), then our decode requests. vLLM's runner over the whole batch
    gives our fields shifted by the prefill requests' logit rows and draft counts (0)."""
    prefill_tokens = [7, 4]  # two prompt chunks, both finishing this step: one sampled row each
    P = len(prefill_tokens)
    s = make_step(seed=21, R=6, token_offset=sum(prefill_tokens))
    plan, R = s["plan"], s["R"]
    vl = plan.verify_lens[:R].tolist()
    d = avv.spec_decode_metadata(plan, s["draft_tokens"], R)
    ids = torch.zeros(int(plan.query_start_loc[R]), dtype=torch.int32)  # prefill token ids are irrelevant here
    ids[sum(prefill_tokens):] = plan.input_ids[: int(plan.query_start_loc[R]) - sum(prefill_tokens)]
    theirs = vllm_runner_metadata(vllm, [0] * P + vl, np.cumsum(prefill_tokens + [1 + L for L in vl]), ids)
    assert theirs.num_draft_tokens[P:] == d["num_draft_tokens"]
    assert theirs.logits_indices[P:].tolist() == d["logits_indices"].tolist()  # token space: already global
    assert theirs.target_logits_indices.tolist() == (d["target_logits_indices"] + P).tolist()
    assert theirs.bonus_logits_indices[P:].tolist() == (d["bonus_logits_indices"] + P).tolist()
    assert theirs.cu_num_draft_tokens[P:].tolist() == d["cu_num_draft_tokens"].tolist()
    assert theirs.cu_num_sampled_tokens[P:].tolist() == (d["cu_num_sampled_tokens"] + P).tolist()
    assert theirs.draft_token_ids.tolist() == d["draft_token_ids"].tolist()


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"seed{c['seed']}")
def test_common_attention_metadata_methods(vllm, case):
    """The real CommonAttentionMetadata from our plan; its own methods read back the plan's layout."""
    s = make_step(**case)
    plan, R, K = s["plan"], s["R"], s["K"]
    vl = plan.verify_lens[:R].tolist()
    cls = vllm.backend.CommonAttentionMetadata
    with pytest.raises(ValueError, match="query_start_loc_cpu"):
        avv.build(cls, avv.attention_metadata(plan, s["bt"], 1 + K, R))  # vLLM 0.33 requires the host copy
    m = avv.build(cls, avv.attention_metadata(plan, s["bt"], 1 + K, R, host_copies=True))
    assert m.batch_size() == R
    assert m.naive_query_lens().tolist() == [1 + L for L in vl]
    assert m.compute_num_computed_tokens().tolist() == s["ctx"].tolist()  # seq_lens - query lens = context
    assert int(m.query_start_loc_cpu[-1]) - int(m.query_start_loc_cpu[0]) == sum(1 + L for L in vl)
    assert m.slot_mapping.shape[0] == m.num_actual_tokens == plan.token_req.numel()
    # unpadded(): vLLM trims the padded batch to the real tokens and requests.
    real = sum(1 + L for L in vl)
    u = m.unpadded(real, R)
    assert u.num_actual_tokens == real and u.slot_mapping.tolist() == m.slot_mapping[:real].tolist()
    assert (u.slot_mapping >= 0).all() and (m.slot_mapping[real:] == avv.PAD_SLOT_ID).all()
    assert u.seq_lens.tolist() == [c + 1 + L for c, L in zip(s["ctx"].tolist(), vl)]
    r2 = m.replace(max_query_len=2)
    assert r2.max_query_len == 2 and r2.seq_lens is m.seq_lens


def test_common_attention_metadata_padded_rows(vllm):
    """A plan padded to R_pad rows: CommonAttentionMetadata built over all R_pad rows (as vLLM does for a
    CUDA-graph batch) sees q_len 0 and seq_len 0 on the padding rows, and unpadded() drops them."""
    s = make_step(seed=30, R=5, R_pad=8, T_pad=48)
    plan = s["plan"]
    bt = torch.cat([s["bt"], torch.zeros(3, s["bt"].shape[1], dtype=torch.int32)])
    m = avv.build(vllm.backend.CommonAttentionMetadata, avv.attention_metadata(plan, bt, 1 + s["K"], 8, host_copies=True))
    q = m.naive_query_lens().tolist()
    assert q[5:] == [0, 0, 0] and m.seq_lens[5:].tolist() == [0, 0, 0]
    u = m.unpadded(int(plan.query_start_loc[5]), 5)
    assert u.batch_size() == 5 and u.naive_query_lens().tolist() == q[:5]


@pytest.mark.parametrize("temperature", [None, 1.0])
def test_parse_output_equals_sampled_token_ids(vllm, temperature):
    """Our rejection_sample output as vLLM's sampler tensor, through RejectionSampler.parse_output, gives
    exactly sampled_token_ids' lists (ids >= vocab_size dropped by both), and the output stays in vLLM's
    [R, max_spec_len + 1] shape with its PLACEHOLDER_TOKEN_ID."""
    s = make_step(seed=40, R=9, R_pad=11, token_offset=3)
    plan, R = s["plan"], s["R"]
    d = avv.spec_decode_metadata(plan, s["draft_tokens"], R)
    V = 64
    logits = torch.randn(d["logits_indices"].numel(), V, generator=torch.Generator().manual_seed(2))
    dt = s["draft_tokens"] % V
    kw = {} if temperature is None else dict(temperature=torch.full((R,), temperature), seeds=torch.arange(R))
    out, emitted = av.rejection_sample(logits, avv.sampler_query_start_loc(plan, R), dt, **kw)
    assert avv.PLACEHOLDER_TOKEN_ID == vllm.sampler.PLACEHOLDER_TOKEN_ID
    t = avv.output_token_ids(out, max(d["num_draft_tokens"]))
    assert t.shape == (R, max(d["num_draft_tokens"]) + 1)
    for vocab in (V, V // 2):
        theirs, _ = vllm.sampler.RejectionSampler.parse_output(t, vocab)
        assert theirs == avv.sampled_token_ids(out, emitted, vocab_size=vocab)
    theirs, _ = vllm.sampler.RejectionSampler.parse_output(t, V, discard_req_indices=[1, 4])
    ours = avv.sampled_token_ids(out, emitted)
    assert theirs == [[] if r in (1, 4) else ours[r] for r in range(R)]
    # Every emitted token is an accepted draft, then one recovered or bonus token.
    for r in range(R):
        e = int(emitted[r])
        assert 1 <= e <= d["num_draft_tokens"][r] + 1 and ours[r][:-1] == dt[r, : e - 1].tolist()


def test_drafts_round_trip_through_vllm(vllm):
    """vLLM's DraftTokenIds -> ours -> vLLM's again, and the planner verifies a prefix of exactly those ids."""
    rng = np.random.default_rng(50)
    lists = [[int(x) for x in rng.integers(0, VOCAB, rng.integers(0, 6))] for _ in range(7)]
    dti = vllm.outputs.DraftTokenIds(req_ids=[f"req-{i}" for i in range(7)], draft_token_ids=lists)
    tokens, drafts = avv.drafts_from_vllm(dti.draft_token_ids, 5)
    back = vllm.outputs.DraftTokenIds(req_ids=dti.req_ids, draft_token_ids=avv.drafts_to_vllm(tokens, drafts))
    assert back == dti
    plan = av.plan_verification(av.prefix_survival(torch.full((7, 5), 0.8), drafts), drafts, mode="fixed", budget=9,
                                context_lens=torch.zeros(7, dtype=torch.int32),
                                anchor_tokens=torch.zeros(7, dtype=torch.int32), draft_tokens=tokens)
    d = avv.spec_decode_metadata(plan, tokens)
    vl = plan.verify_lens.tolist()
    assert d["draft_token_ids"].tolist() == [x for r in range(7) for x in lists[r][: vl[r]]]
    # A proposer's [R, k] tensor with vLLM's -1 padding ends each request at its first -1.
    t = torch.tensor([[5, 6, -1], [-1, -1, -1], [1, 2, 3]])
    assert avv.drafts_to_vllm(*avv.drafts_from_vllm(t, 5)) == [[5, 6], [], [1, 2, 3]]
