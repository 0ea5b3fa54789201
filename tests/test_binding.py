"""The named parameter structs across the binding (python/adaptive_verify/_binding.py, csrc/bindings/).

Every op passes the extension the address of a C struct filled by field name. These tests check that (1) the
ctypes mirrors have exactly the C layout (the extension exports each field's name, offset and size), and
(2) every op's wrapper puts each value in the field of that name: each op is called with sizes, strides and
scalars that all differ, the extension call is intercepted, and every field is read back by name. Two fields
swapped anywhere between the wrapper and the struct make a value land under the other name and fail here.
"""
import ctypes
import importlib

import pytest
import torch

import adaptive_verify as av
from adaptive_verify import _binding
from adaptive_verify._ext import _C

STRUCTS = {name: getattr(_binding, name) for name in (
    "SurvivalParams", "PlannerParams", "ConfidenceParams", "LogitParams", "MarginParams", "StatsParams",
    "RejectionParams", "SampleParams", "TreeSampleParams", "AttentionParams", "WriteKvParams", "CommitTreeKvParams")}


@pytest.mark.parametrize("name", sorted(STRUCTS))
def test_ctypes_mirror_has_the_c_layout(name):
    cls = STRUCTS[name]
    layout = getattr(_C, cls.__name__)
    fields, size = layout
    assert ctypes.sizeof(cls) == size
    assert [f[0] for f in sorted(fields, key=lambda f: f[1])] == list(_binding.fields_of(cls))
    for f_name, offset, f_size, _ in fields:
        assert getattr(cls, f_name).offset == offset and getattr(cls, f_name).size == f_size, f_name
    assert len({f[0] for f in fields}) == len(fields), "a field exported twice"


def test_struct_type_rejects_a_missing_field():
    """A field left out of the bindings' export shifts the offsets after it: caught at import."""
    fields, size = _C.PLANNER_PARAMS
    with pytest.raises(ImportError, match="PLANNER_PARAMS"):
        _binding.struct_type("PLANNER_PARAMS", ([f for f in fields if f[0] != "min_verify"], size))


class _Capture:
    """Stands in for adaptive_verify._C in a module: records a copy of the struct each op receives (the
    wrapper's own struct is gone once the call returns) and returns success, so no kernel runs."""

    def __init__(self, real, struct):
        self._real, self._struct, self.seen = real, struct, {}

    def __getattr__(self, name):
        real = getattr(self._real, name)
        if name.isupper() or name in ("attention_workspace_floats", "plan_workspace_bytes", "error_string",
                                      "sampler_splitv_workspace_bytes"):
            return real

        def op(address, on_cuda, stream):
            copy = self._struct()
            ctypes.memmove(ctypes.addressof(copy), address, ctypes.sizeof(copy))
            self.seen[name] = (copy, on_cuda, stream)
            return 0
        return op


def _captured(monkeypatch, module_name, struct, call):
    module = importlib.import_module(module_name)
    cap = _Capture(module._C, struct)
    monkeypatch.setattr(module, "_C", cap)
    keep = call()  # keeps the struct's tensors alive while it is read
    (copy, on_cuda, stream), = cap.seen.values()
    assert on_cuda is False and stream == 0
    return copy, keep


def _fields(p, cls):
    """Every field by name (an array field as a list)."""
    values = {name: getattr(p, name) for name in _binding.fields_of(cls)}
    return {name: list(v) if isinstance(v, ctypes.Array) else v for name, v in values.items()}


def test_draft_depth_fields_by_name(monkeypatch):
    """choose_draft_depth fills the planner struct's depth fields: the range, each depth's fixed cost and latency cap
    (the arrays by value), and the depth output."""
    R, K = 6, 5
    survival = torch.rand(R, K)
    drafts = torch.full((R,), K, dtype=torch.int32)
    ct = av.CostTable.from_points({1: 1.0, 512: 3.0}, draft_ms=2.0, draft_levels=K, draft_level_ms=0.25,
                                  request_ms=0.125)
    p, out = _captured(monkeypatch, "adaptive_verify.planner.launch", _binding.PlannerParams,
                       lambda: av.choose_draft_depth(survival, drafts, ct, min_verify=2, max_verify=4, min_depth=1,
                                                     max_step_ms=1.9))
    f = _fields(p, _binding.PlannerParams)
    assert (f["choose_depth"], f["min_depth"], f["max_depth"], f["write_plan"]) == (1, 2, 4, 0)
    assert f["depth_out"] == out[0].data_ptr() and f["budget_out"] == out[1].data_ptr()
    rest = _C.PLANNER_MAX_SHAPES - 5
    assert f["depth_cost"][:5] == [pytest.approx(ct.fixed_cost(R, d)) for d in range(5)] and f["depth_cost"][5:] == \
        [0.0] * rest
    caps = f["depth_step_cap"]
    assert caps[0] > caps[4] >= 0 and caps[5:] == [0] * rest  # a deeper draft leaves less of the target to verify
    assert f["num_widths"] == 0 and f["width_out"] is None  # (chains: one width)
    assert f["shape_width"] == [0] * _C.PLANNER_MAX_SHAPES and f["level_widths_out"] is None


def test_tree_shape_width_fields_by_name(monkeypatch):
    """choose_tree_shape(widths=) fills the struct's profiles (a uint8 array by value: profile P's width at level l
    at (P - 1) * (max_depth + 1) + l) and the per-level widths output; max_width= writes uniform profiles and the
    0-d width output."""
    R, N = 3, 7
    survival = torch.rand(R, N)
    parents = torch.tensor([[-1, -1, 0, 0, 1, 2, 2]], dtype=torch.int32).repeat(R, 1)
    sizes = torch.full((R,), N, dtype=torch.int32)
    ct = av.CostTable.from_points({1: 1.0, 512: 3.0}, draft_ms=2.0, draft_levels=3, draft_level_ms=0.25)
    profiles = [(1, 1), (2, 1), (2, 2)]
    p, out = _captured(monkeypatch, "adaptive_verify.planner.launch", _binding.PlannerParams,
                       lambda: av.choose_tree_shape(survival, parents, sizes, ct, widths=profiles))
    f = _fields(p, _binding.PlannerParams)
    assert (f["num_widths"], f["max_depth"]) == (3, 3)
    assert f["shape_width"][:12] == [0, 1, 1, 0, 0, 2, 1, 0, 0, 2, 2, 0] and f["shape_width"][12:] == \
        [0] * (_C.PLANNER_MAX_SHAPES - 12)
    assert f["level_widths_out"] == out[1].data_ptr() and f["width_out"] is None and out[1].shape == (3,)
    p, out = _captured(monkeypatch, "adaptive_verify.planner.launch", _binding.PlannerParams,
                       lambda: av.choose_tree_shape(survival, parents, sizes, ct, max_width=2))
    f = _fields(p, _binding.PlannerParams)
    assert f["shape_width"][:8] == [0, 1, 1, 0, 0, 2, 2, 0] and f["level_widths_out"] is None
    assert f["width_out"] == out[1].data_ptr()


def test_planner_fields_by_name(monkeypatch):
    R, K = 5, 7
    survival = torch.rand(R, 9)[:, :K]  # row stride 9
    drafts = torch.tensor([1, 2, 3, 4, 5], dtype=torch.int32)
    ctx = torch.arange(R, dtype=torch.int32) + 100
    bt = torch.zeros(R, 13, dtype=torch.int32)
    anchors = torch.arange(R, dtype=torch.int32)
    tokens = torch.zeros(R, 11, dtype=torch.int32)[:, :8]  # row stride 11
    ct = av.CostTable.from_points({1: 1.0, 512: 3.0}, draft_ms=0.25)
    budget = torch.tensor(6, dtype=torch.int32)
    kw = dict(mode="fixed", budget=budget, min_verify=2, max_verify=6, extra_tokens=17, extra_emitting=19,
              capacity=300, context_lens=ctx, block_table=bt, block_size=23, anchor_tokens=anchors, draft_tokens=tokens,
              token_offset=29, num_reqs_padded=31, num_tokens_padded=61)
    p, plan = _captured(monkeypatch, "adaptive_verify.planner.launch", _binding.PlannerParams,
                        lambda: (av.plan_verification(survival, drafts, ct, **kw), survival, drafts))
    f = _fields(p, _binding.PlannerParams)
    plan = plan[0]
    want = dict(survival=survival.data_ptr(), survival_stride=9, drafts=drafts.data_ptr(), num_reqs=R, max_drafts=K,
                conf=None, conf_stride=0, survival_out=None, weights=None, step_cap=1 << 62, parents=None,
                parents_stride=0,
                mode=2, fixed_budget=0, budget_in=budget.data_ptr(), min_verify=2, max_verify=6, extra_tokens=17,
                extra_emitting=19, budget_cap=min(R * 6, 300 - R - 17, 61 - R), verify_cost=None, verify_cost_len=0,
                context_lens=ctx.data_ptr(), block_table=bt.data_ptr(), block_table_stride=13, max_blocks=13,
                block_size=23, anchor_tokens=anchors.data_ptr(), draft_tokens=tokens.data_ptr(), draft_tokens_stride=11,
                token_offset=29, num_reqs_padded=31, num_tokens_padded=61, write_plan=1,
                verify_lens=plan.verify_lens.data_ptr(), budget_out=plan.budget.data_ptr(),
                expected_tokens=plan.expected_tokens.data_ptr(), num_tokens=plan.num_tokens.data_ptr(),
                query_start_loc=plan.query_start_loc.data_ptr(), seq_lens=plan.seq_lens.data_ptr(),
                token_req=plan.token_req.data_ptr(), positions=plan.positions.data_ptr(),
                slot_mapping=plan.slot_mapping.data_ptr(), input_ids=plan.input_ids.data_ptr(), tree_mask=None,
                token_parent=None, token_node=None, token_depth=None, workspace=None, choose_depth=0, min_depth=0,
                max_depth=0, num_widths=0, depth_cost=[0.0] * _C.PLANNER_MAX_SHAPES,
                depth_step_cap=[0] * _C.PLANNER_MAX_SHAPES, shape_width=[0] * _C.PLANNER_MAX_SHAPES, depth_out=None,
                width_out=None, level_widths_out=None)
    assert f.pop("draft_cost") == pytest.approx(0.25)
    assert f.pop("error_counts") == av.errors.error_buffer("cpu").data_ptr()
    assert f == want

    # The same call as a draft tree: parents and the four tree outputs, everything else in the same fields.
    parents = torch.full((R, 10), -1, dtype=torch.int32)[:, :K]  # row stride 10
    p, plan = _captured(monkeypatch, "adaptive_verify.planner.launch", _binding.PlannerParams,
                        lambda: (av.plan_tree_verification(survival, parents, drafts, ct, **kw), survival, drafts,
                                 parents))
    f = _fields(p, _binding.PlannerParams)
    plan = plan[0]
    want.update(parents=parents.data_ptr(), parents_stride=10, tree_mask=plan.tree_mask.data_ptr(),
                token_parent=plan.token_parent.data_ptr(), token_node=plan.token_node.data_ptr(),
                token_depth=plan.token_depth.data_ptr())
    for name in ("verify_lens", "budget_out", "expected_tokens", "num_tokens", "query_start_loc", "seq_lens",
                 "token_req", "positions", "slot_mapping", "input_ids"):
        want[name] = getattr(plan, "budget" if name == "budget_out" else name).data_ptr()
    f.pop("draft_cost"), f.pop("error_counts")
    assert f == want


def test_planner_weights_and_step_cap_by_name(monkeypatch):
    R, K = 4, 3
    survival, drafts = torch.ones(R, K), torch.full((R,), K, dtype=torch.int32)
    w = torch.tensor([1.0, 2.0, 0.5, 1.0])
    ct = av.CostTable.from_points({1: 1.0, 64: 2.0}, draft_ms=0.5)
    target = float(ct.fixed_cost(R) + ct.verify_cost(R + 5)) + 1e-4
    p, _ = _captured(monkeypatch, "adaptive_verify.planner.launch", _binding.PlannerParams,
                     lambda: (av.plan_verification(survival, drafts, ct, mode="all", weights=w, max_step_ms=target),
                              survival, w))
    f = _fields(p, _binding.PlannerParams)
    assert (f["weights"], f["step_cap"]) == (w.data_ptr(), 5)


def test_planner_confidence_fields_by_name(monkeypatch):
    """plan_verification(conf=...): the kernel reads the confidences and writes survival_out, which is also the
    survival it plans on (contiguous, stride K)."""
    R, K = 5, 7
    conf = torch.rand(R, 12)[:, :K]  # row stride 12
    drafts = torch.tensor([1, 2, 3, 4, 5], dtype=torch.int32)
    buf = torch.empty(R, K)
    p, _ = _captured(monkeypatch, "adaptive_verify.planner.launch", _binding.PlannerParams,
                     lambda: (av.plan_verification(None, drafts, mode="all", conf=conf, survival_out=buf), conf))
    f = _fields(p, _binding.PlannerParams)
    assert (f["conf"], f["conf_stride"], f["survival_out"]) == (conf.data_ptr(), 12, buf.data_ptr())
    assert (f["survival"], f["survival_stride"]) == (buf.data_ptr(), K)


def test_survival_fields_by_name(monkeypatch):
    conf = torch.rand(6, 10)[:, :4]
    drafts = torch.tensor([4, 3, 2, 1, 0, 4], dtype=torch.int32)
    p, (out, *_) = _captured(monkeypatch, "adaptive_verify.planner.survival", _binding.SurvivalParams,
                             lambda: (av.prefix_survival(conf, drafts), conf, drafts))
    want = dict(conf=conf.data_ptr(), conf_stride=10, parents=None, parents_stride=0, drafts=drafts.data_ptr(),
                num_reqs=6, max_drafts=4, survival=out.data_ptr(), error_counts=av.errors.error_buffer("cpu").data_ptr())
    assert _fields(p, _binding.SurvivalParams) == want
    parents = torch.full((6, 7), -1, dtype=torch.int32)[:, :4]
    p, (out, *_) = _captured(monkeypatch, "adaptive_verify.planner.survival", _binding.SurvivalParams,
                             lambda: (av.tree_survival(conf, parents, drafts), conf, drafts, parents))
    want.update(parents=parents.data_ptr(), parents_stride=7, survival=out.data_ptr())
    assert _fields(p, _binding.SurvivalParams) == want


def test_rejection_and_sample_fields_by_name(monkeypatch):
    R, K, V, T = 3, 4, 13, 9
    logits = torch.randn(T, 17)[:, :V]
    qsl = torch.tensor([0, 2, 5, 9], dtype=torch.int32)
    drafts = torch.zeros(R, 6, dtype=torch.int64)[:, :K]
    probs = torch.rand(R, 5, 20)[:, :K, :V]
    probs = probs.contiguous()
    temperature = torch.full((R,), 0.5)
    seeds = torch.arange(R, dtype=torch.int64) + 7
    p, (tokens, emitted) = _captured(monkeypatch, "adaptive_verify.sampling", _binding.RejectionParams, lambda: av.rejection_sample(
        logits, qsl, drafts, draft_probs=probs, temperature=temperature, seeds=seeds, offset=41))
    assert _fields(p, _binding.RejectionParams) == dict(
        logits=logits.data_ptr(), logits_stride=17, dtype=0, num_tokens=T, vocab=V, query_start_loc=qsl.data_ptr(),
        draft_tokens=drafts.data_ptr(), draft_tokens_stride=6, draft_tokens_int64=1, draft_probs=probs.data_ptr(),
        draft_probs_stride_r=K * V, draft_probs_stride_k=V, temperature=temperature.data_ptr(),
        seeds=seeds.data_ptr(), offset=41, offset_ptr=None, num_reqs=R, max_drafts=K, top_k=None, top_p=None,
        min_p=None, output_tokens=tokens.data_ptr(), num_emitted=emitted.data_ptr(), logprobs=None,
        error_counts=av.errors.error_buffer("cpu").data_ptr(), kernel=0, workspace=None, workspace_bytes=0)
    top_k, top_p, min_p = torch.tensor([1, 0, 3], dtype=torch.int32), torch.full((R,), 0.5), torch.zeros(R)
    p, (_, _, lps) = _captured(monkeypatch, "adaptive_verify.sampling", _binding.RejectionParams,
                               lambda: av.rejection_sample(logits, qsl, drafts, temperature=temperature, seeds=seeds,
                                                           top_k=top_k, top_p=top_p, min_p=min_p, logprobs=True))
    f = _fields(p, _binding.RejectionParams)
    assert (f["top_k"], f["top_p"], f["min_p"], f["logprobs"]) == (top_k.data_ptr(), top_p.data_ptr(),
                                                                   min_p.data_ptr(), lps.data_ptr())
    p, out = _captured(monkeypatch, "adaptive_verify.sampling", _binding.SampleParams,
                       lambda: av.sample(logits, temperature.repeat(3), seeds.repeat(3), 43))
    assert _fields(p, _binding.SampleParams)["logits_stride"] == 17
    f = _fields(p, _binding.SampleParams)
    assert (f["vocab"], f["num_rows"], f["offset"], f["tokens"]) == (V, T, 43, out.data_ptr())
    k9, p9, m9 = torch.full((T,), 2, dtype=torch.int32), torch.full((T,), 0.9), torch.full((T,), 0.1)
    p, (out, lps) = _captured(monkeypatch, "adaptive_verify.sampling", _binding.SampleParams,
                              lambda: av.sample(logits, temperature.repeat(3), seeds.repeat(3), 43, top_k=k9,
                                                top_p=p9, min_p=m9, logprobs=True))
    f = _fields(p, _binding.SampleParams)
    assert (f["top_k"], f["top_p"], f["min_p"], f["tokens"], f["logprobs"]) == (
        k9.data_ptr(), p9.data_ptr(), m9.data_ptr(), out.data_ptr(), lps.data_ptr())


def test_tree_sample_fields_by_name(monkeypatch):
    R, V, T, W = 2, 13, 7, 5
    logits = torch.randn(T, 17)[:, :V]
    qsl = torch.tensor([0, 3, 7], dtype=torch.int32)
    parent = torch.tensor([-1, 0, 0, -1, 0, 1, 1], dtype=torch.int32)
    ids = torch.arange(T, dtype=torch.int64)
    temperature, seeds = torch.full((R,), 0.5), torch.arange(R, dtype=torch.int64) + 7
    top_k, top_p, min_p = torch.tensor([1, 0], dtype=torch.int32), torch.full((R,), 0.5), torch.zeros(R)
    p, (tokens, emitted, offsets) = _captured(monkeypatch, "adaptive_verify.sampling_tree", _binding.TreeSampleParams,
                                              lambda: av.tree_rejection_sample(
                                                  logits, qsl, parent, ids, W, temperature=temperature, seeds=seeds,
                                                  offset=41, top_k=top_k, top_p=top_p, min_p=min_p))
    assert _fields(p, _binding.TreeSampleParams) == dict(
        logits=logits.data_ptr(), logits_stride=17, dtype=0, num_tokens=T, vocab=V, query_start_loc=qsl.data_ptr(),
        token_parent=parent.data_ptr(), input_ids=ids.data_ptr(), input_ids_int64=1,
        temperature=temperature.data_ptr(), seeds=seeds.data_ptr(), offset=41, offset_ptr=None, num_reqs=R,
        max_query_len=W, top_k=top_k.data_ptr(), top_p=top_p.data_ptr(), min_p=min_p.data_ptr(),
        output_tokens=tokens.data_ptr(), num_emitted=emitted.data_ptr(), accepted_offsets=offsets.data_ptr(),
        logprobs=None, error_counts=av.errors.error_buffer("cpu").data_ptr())
    p, (_, _, _, lps) = _captured(monkeypatch, "adaptive_verify.sampling_tree", _binding.TreeSampleParams,
                                  lambda: av.tree_rejection_sample(logits, qsl, parent, ids, W, logprobs=True))
    f = _fields(p, _binding.TreeSampleParams)
    assert (f["logprobs"], f["temperature"], f["seeds"], f["input_ids_int64"]) == (lps.data_ptr(), None, None, 1)


def test_attention_and_write_kv_fields_by_name(monkeypatch):
    T, Hq, Hkv, D, bs, blocks, R = 5, 8, 2, 64, 16, 7, 2
    q = torch.randn(T, Hq + 1, D).to(torch.bfloat16)[:, :Hq]  # head stride D, token stride (Hq + 1) D
    kc, vc = (torch.randn(blocks, bs, Hkv, D).to(torch.bfloat16) for _ in range(2))
    bt = torch.zeros(R, 3, dtype=torch.int32)
    seq = torch.tensor([20, 3], dtype=torch.int32)
    qsl = torch.tensor([0, 3, 5], dtype=torch.int32)
    p, (out, lse) = _captured(monkeypatch, "adaptive_verify.attention", _binding.AttentionParams,
                              lambda: av.verify_attention(q, kc, vc, bt, seq, qsl, 4, scale=0.375, return_lse=True))
    want = dict(q=q.data_ptr(), q_stride_t=(Hq + 1) * D, q_stride_h=D, k_cache=kc.data_ptr(), v_cache=vc.data_ptr(),
                block_table=bt.data_ptr(), block_table_stride=3, max_blocks=3, seq_lens=seq.data_ptr(),
                query_start_loc=qsl.data_ptr(), dtype=2, num_reqs=R, num_tokens=T, num_q_heads=Hq, num_kv_heads=Hkv,
                head_dim=D, block_size=bs, num_blocks=blocks, max_query_len=4, scale=0.375, out=out.data_ptr(),
                lse=lse.data_ptr(), error_counts=av.errors.error_buffer("cpu").data_ptr(), kernel=0, workspace=None,
                tree_mask=None, kv_dtype=2, k_scale=1.0, v_scale=1.0, k_scales=None, v_scales=None, k_scale_stride=0,
                v_scale_stride=0, v_head_dim=D, sinks=None, window_left=-1, softcap=0.0)
    assert _fields(p, _binding.AttentionParams) == want
    # an fp8 cache with a per-head K scale tensor and a per-tensor V float
    kc8, vc8 = kc.to(torch.float8_e4m3fn), vc.to(torch.float8_e4m3fn)
    ks = torch.tensor([0.5, 0.25])
    p, _ = _captured(monkeypatch, "adaptive_verify.attention", _binding.AttentionParams,
                     lambda: av.verify_attention(q, kc8, vc8, bt, seq, qsl, 4, k_scale=ks, v_scale=0.125))
    got = _fields(p, _binding.AttentionParams)
    assert (got["kv_dtype"], got["k_scales"], got["k_scale_stride"], got["v_scales"], got["v_scale"]) == \
        (3, ks.data_ptr(), 1, None, 0.125)
    mask = torch.tensor([1, 3, 5, 1, 3], dtype=torch.int64)
    p, _ = _captured(monkeypatch, "adaptive_verify.attention", _binding.AttentionParams,
                     lambda: av.verify_attention(q, kc, vc, bt, seq, qsl, 4, scale=0.375, tree_mask=mask))
    assert _fields(p, _binding.AttentionParams)["tree_mask"] == mask.data_ptr()
    k = torch.randn(T, Hkv + 1, D).to(torch.bfloat16)[:, :Hkv]
    v = torch.randn(T, Hkv, D + 64).to(torch.bfloat16)[:, :, :D]
    slots = torch.arange(T, dtype=torch.int64)
    p, _ = _captured(monkeypatch, "adaptive_verify.attention", _binding.WriteKvParams,
                     lambda: av.write_kv(k, v, kc, vc, slots))
    assert _fields(p, _binding.WriteKvParams) == dict(
        k=k.data_ptr(), v=v.data_ptr(), k_stride_t=(Hkv + 1) * D, k_stride_h=D, v_stride_t=Hkv * (D + 64),
        v_stride_h=D + 64, k_cache=kc.data_ptr(), v_cache=vc.data_ptr(), slot_mapping=slots.data_ptr(), num_tokens=T,
        num_kv_heads=Hkv, head_dim=D, block_size=bs, num_blocks=blocks, elem_size=2,
        error_counts=av.errors.error_buffer("cpu").data_ptr(), cache_dtype=2, dtype=2, k_scale=1.0, v_scale=1.0,
        k_scales=None, v_scales=None, k_scale_stride=0, v_scale_stride=0, cache_row=0, cache_offset=0)
    ctx = torch.tensor([5, 9], dtype=torch.int32)
    offsets = torch.zeros(R, 11, dtype=torch.int32)[:, :6]  # row stride 11
    accepted = torch.tensor([0, 3], dtype=torch.int32)
    p, _ = _captured(monkeypatch, "adaptive_verify.attention", _binding.CommitTreeKvParams,
                     lambda: av.commit_tree_kv(kc, vc, bt, ctx, offsets, accepted))
    assert _fields(p, _binding.CommitTreeKvParams) == dict(
        k_cache=kc.data_ptr(), v_cache=vc.data_ptr(), num_blocks=blocks, block_size=bs, row_bytes=Hkv * D * 2,
        block_table=bt.data_ptr(), block_table_stride=3, max_blocks=3, context_lens=ctx.data_ptr(),
        accepted_offsets=offsets.data_ptr(), accepted_offsets_stride=11, width=6, num_accepted=accepted.data_ptr(),
        num_reqs=R, error_counts=av.errors.error_buffer("cpu").data_ptr())


def test_confidence_area_fields_by_name(monkeypatch):
    R, K, H, Q = 3, 5, 16, 4
    hidden = torch.randn(R, K + 1, H + 8).to(torch.bfloat16)[:, :K, :H]
    markov = torch.randn(R, K, Q + 2).to(torch.bfloat16)[:, :, :Q]
    weight = torch.randn(H + Q)
    temperature = torch.full((K,), 2.0)
    p, out = _captured(monkeypatch, "adaptive_verify.confidence", _binding.ConfidenceParams, lambda: av.confidence(
        hidden, weight, bias=0.125, markov=markov, temperature=temperature, survival=True))
    f = _fields(p, _binding.ConfidenceParams)
    assert f.pop("weight") != 0 and f.pop("temperature") != 0  # converted copies
    assert f == dict(hidden=hidden.data_ptr(), hidden_stride_r=(K + 1) * (H + 8), hidden_stride_k=H + 8,
                     markov=markov.data_ptr(), markov_stride_r=K * (Q + 2), markov_stride_k=Q + 2, dtype=2, bias=0.125,
                     bias_ptr=None, num_reqs=R, max_drafts=K, hidden_size=H, markov_size=Q, survival=1,
                     out=out.data_ptr())
    logits = torch.randn(R, K + 3)[:, :K]
    p, out = _captured(monkeypatch, "adaptive_verify.confidence", _binding.LogitParams,
                       lambda: av.confidence_from_logits(logits))
    assert _fields(p, _binding.LogitParams) == dict(logits=logits.data_ptr(), logits_stride=K + 3, dtype=0,
                                                    temperature=None, num_reqs=R, max_drafts=K, survival=0,
                                                    out=out.data_ptr())
    dl = torch.randn(R, K + 1, 30)[:, :K, :]
    p, out = _captured(monkeypatch, "adaptive_verify.confidence", _binding.MarginParams, lambda: av.draft_margin(dl))
    assert _fields(p, _binding.MarginParams) == dict(logits=dl.data_ptr(), stride_r=(K + 1) * 30, stride_k=30, dtype=0,
                                                     num_reqs=R, max_drafts=K, vocab=30, out=out.data_ptr(),
                                                     error_counts=av.errors.error_buffer("cpu").data_ptr())
    stats = av.AcceptanceStats(6, num_bins=9)
    conf = torch.rand(R, 8)[:, :K]
    vl = torch.tensor([1, 2, 3], dtype=torch.int32)
    na = torch.tensor([0, 1, 2], dtype=torch.int32)
    p, _ = _captured(monkeypatch, "adaptive_verify.stats", _binding.StatsParams,
                     lambda: stats.update(conf, vl, na))
    f = _fields(p, _binding.StatsParams)
    assert (f["conf"], f["conf_stride"], f["verify_lens"], f["num_accepted"], f["num_reqs"], f["max_drafts"],
            f["num_positions"], f["num_bins"], f["trials"], f["survivals"]) == (
        conf.data_ptr(), 8, vl.data_ptr(), na.data_ptr(), R, K, 6, 9, stats.trials.data_ptr(),
        stats.survivals.data_ptr())
    assert f["totals"] == stats.totals.data_ptr()
