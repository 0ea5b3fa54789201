"""adaptive_verify.integrations.sglang and the planner against the installed SGLang (CPU).

- SGLang's DSpark varlen verify layout (``RaggedVerifyLayout``, its own constructors, checks and target-verify
  geometry) built from our plan;
- DSpark's verify-length schedule (``schedule_verify_lens_topk``, the torch path SGLang runs on CPU tensors)
  against ``plan_verification`` on random batches, every disagreement classified;
- SGLang's Triton kernels (the EAGLE topk = 1 chain-tree builder, the schedule's GPU kernel) under Triton's CPU
  interpreter, in a subprocess (sglang_interpreted.py).

Not importable on a CPU torch, so not tested here (docs/integrations/sglang.md): DSpark's budget
(``compute_verify_token_budget``, in dspark_planner), the verify window (dspark_verify_window) and EagleVerifyInput
(eagle_info): each pulls torchvision in through sglang.srt.configs.
"""
import collections
import json
import os
import subprocess
import sys
import types
from pathlib import Path

import numpy as np
import pytest
import torch

import adaptive_verify as av
from adaptive_verify.integrations import sglang as avs
from peers import SGLangScheduleConfig, import_peer, require_peers
from steps import CASES, make_step

require_peers("sglang", "triton")

HERE = Path(__file__).resolve().parent


@pytest.fixture(scope="module")
def sg():
    return types.SimpleNamespace(
        schedule=import_peer("sglang.kernels.ops.speculative.dspark.dspark_schedule"),
        ragged=import_peer("sglang.srt.speculative.ragged_verify"),
    )


# ----------------------------------------------------------------------------------------------------------------
# RaggedVerifyLayout
# ----------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"seed{c['seed']}")
def test_ragged_layout_from_plan(sg, case):
    s = make_step(**case)
    plan, R, K = s["plan"], s["R"], s["K"]
    vl = plan.verify_lens[:R].tolist()
    graph = plan.token_req.numel()  # the plan's padded token count
    Layout = sg.ragged.RaggedVerifyLayout
    ours = Layout(**avs.ragged_layout_fields(plan, graph, R, verify_lens_host=vl))  # runs SGLang's __post_init__
    theirs = Layout.from_verify_lens_device(verify_lens=torch.tensor([1 + x for x in vl], dtype=torch.int32),
                                            graph_num_tokens=graph)
    for f in ("verify_lens", "extend_start_loc", "qo_indptr_device"):
        assert getattr(ours, f).tolist() == getattr(theirs, f).tolist(), f
        assert getattr(ours, f).dtype == getattr(theirs, f).dtype == torch.int32, f
    assert ours.bs == R and ours.total_verify_tokens == R + sum(vl) <= ours.graph_num_tokens
    # SGLang's attention geometry from its layout is our verify_input's (KV lengths after the step, indptrs).
    geo = sg.ragged.build_ragged_target_verify_geometry(seq_lens=s["ctx"], layout=ours)
    vi = avs.verify_input(plan, K, R)
    assert geo.cache_seqlens_int32.tolist() == vi["end_offset"].tolist()
    assert geo.cu_seqlens_q.tolist() == vi["qo_indptr"].tolist()
    assert geo.cu_seqlens_k.tolist() == vi["kv_indptr"].tolist()
    assert geo.max_seq_len_q == 1 + max(vl)
    # Its host constructor on a graph grid picks the same bucket our padded size came from.
    grid = sorted({R + sum(vl), graph})
    host = Layout.from_verify_lens(verify_lens_cpu=ours.verify_lens_cpu, device=torch.device("cpu"), grid=grid)
    assert host.qo_indptr_device.tolist() == ours.qo_indptr_device.tolist() and host.graph_num_tokens == grid[0]


def test_ragged_layout_checks(sg):
    """SGLang's own checks run on our fields: a graph smaller than the step's tokens is refused there; a
    device-only layout (no host copy, no sync) skips them, as SGLang's from_verify_lens_device does."""
    s = make_step(seed=60, R=6, budget=8)
    plan = s["plan"]
    vl = plan.verify_lens.tolist()
    total = 6 + sum(vl)
    assert sum(vl) == 8
    with pytest.raises(ValueError, match="graph_num_tokens"):
        sg.ragged.RaggedVerifyLayout(**avs.ragged_layout_fields(plan, total - 1, verify_lens_host=vl))
    dev = sg.ragged.RaggedVerifyLayout(**avs.ragged_layout_fields(plan, total))
    assert dev.verify_lens_cpu is None and dev.qo_indptr_device.tolist()[-1] == total
    with pytest.raises(ValueError, match="verify_lens_host"):
        avs.ragged_layout_fields(plan, total, verify_lens_host=vl[:2])
    with pytest.raises(ValueError, match="graph_num_tokens"):
        avs.ragged_layout_fields(plan, -1)
    # Padding to SGLang's captured slot count keeps every real row's tokens where ours are.
    padded = dev.padded_to_bucket(padded_bs=8)
    assert padded.qo_indptr_device[:7].tolist() == dev.qo_indptr_device.tolist()


# ----------------------------------------------------------------------------------------------------------------
# DSpark's verify-length schedule vs plan_verification
# ----------------------------------------------------------------------------------------------------------------

KINDS = ("continuous", "quantised", "joining", "tiny", "above_one", "nan", "negative")
EDGE = {"above_one", "nan", "negative"}
SCHEDULE_CLASSES = {
    "agree": "same verify lengths",
    "eps": "a survival below survival_eps (1e-6) is not a candidate in SGLang; here it ranks last and is verified "
           "when the budget reaches it",
    "above_one": "confidence > 1: clamped here; SGLang's survival grows along the row",
    "nan": "NaN: survival 0 from there on here (candidates ranking last); SGLang drops them (NaN fails its "
           "survival_eps test), so this shows up as eps",
    "negative": "negative confidence: clamped to 0 here; SGLang's products change sign",
    "unexplained": "no class explains it",
}


def confidences(rng, R, G, kind):
    c = rng.beta(3.0, 1.0, (R, G)).astype(np.float32)
    if kind == "quantised":
        c = (rng.integers(1, 5, (R, G)) / 4).astype(np.float32)
    elif kind == "joining":
        c[rng.random(R) < 0.4] = 1.0
    elif kind == "tiny":
        c[rng.random((R, G)) < 0.2] = np.float32(1e-4)
    elif kind == "above_one":
        m = rng.random((R, G)) < 0.15
        c[m] = rng.uniform(1.001, 1.5, int(m.sum()))
    elif kind == "nan":
        c[rng.random((R, G)) < 0.1] = np.nan
    elif kind == "negative":
        m = rng.random((R, G)) < 0.1
        c[m] = -rng.uniform(0.01, 1.0, int(m.sum()))
    return c


def ours_schedule(conf: np.ndarray, budget: int) -> list:
    """SGLang's verify lengths (anchor included) from plan_verification: every position a candidate."""
    R, G = conf.shape
    d = torch.full((R,), G, dtype=torch.int32)
    plan = av.plan_verification(av.prefix_survival(torch.from_numpy(conf), d), d, mode="fixed", budget=budget)
    return (plan.verify_lens + 1).tolist()


def sglang_schedule(sg, conf: np.ndarray, budget: int) -> list:
    cfg = SGLangScheduleConfig(conf.shape[1])
    t = torch.from_numpy(np.ascontiguousarray(conf))
    return sg.schedule.ScheduleVerifyLensTopk.execute(confidence=t, budget=budget, cfg=cfg).tolist()


def classify_schedule(sg, conf, budget, ours, theirs, kind) -> str:
    if ours == theirs:
        return "agree"
    causes = []
    if kind in EDGE:
        clean = np.nan_to_num(np.clip(conf, 0.0, 1.0), nan=0.0).astype(np.float32)
        c = sglang_schedule(sg, clean, budget)
        if c != theirs:
            causes.append(kind)
            theirs, conf = c, clean
        if ours == theirs:
            return "+".join(causes)
    # SGLang verified fewer: the ones only we verified all survive with less than survival_eps.
    s = np.cumprod(np.nan_to_num(np.clip(conf, 0.0, 1.0), nan=0.0), axis=1)
    extra = [(r, j) for r in range(len(ours)) for j in range(theirs[r] - 1, ours[r] - 1)]
    if all(a <= b for a, b in zip(theirs, ours)) and extra and all(s[r, j] < 1e-6 for r, j in extra):
        return "+".join(causes + ["eps"])
    return "+".join(causes + ["unexplained"])


def schedule_differential(sg, batches, seed):
    rng = np.random.default_rng(seed)
    counts = collections.defaultdict(collections.Counter)
    examples = {}
    for i in range(batches):
        kind = KINDS[i % len(KINDS)]
        R, G = int(rng.integers(1, 48)), int(rng.integers(1, 9))
        conf = confidences(rng, R, G, kind)
        budget = int(rng.integers(0, R * G + 1))
        ours, theirs = ours_schedule(conf, budget), sglang_schedule(sg, conf, budget)
        cls = classify_schedule(sg, conf, budget, ours, theirs, kind)
        counts[kind][cls] += 1
        examples.setdefault(cls, dict(kind=kind, budget=budget, ours=ours, sglang=theirs))
    return counts, examples


def test_schedule_differential(sg):
    """SGLang ranks candidates in our canonical order (survival desc, position asc, request asc), so ties agree
    too; every disagreement comes from a value SGLang reads differently."""
    counts, examples = schedule_differential(sg, 1400, seed=0)
    bad = {k: v for k, v in examples.items() if "unexplained" in k}
    assert not bad, bad
    for kind in ("continuous", "quantised", "joining"):
        assert set(counts[kind]) == {"agree"}, (kind, counts[kind])
    assert set(counts["tiny"]) <= {"agree", "eps"} and counts["tiny"]["eps"] > 0, counts["tiny"]
    for kind in EDGE:
        causes = {p for cls in counts[kind] if cls != "agree" for p in cls.split("+")}
        # SGLang reads a NaN as a survival below survival_eps (so do we after clamping: 0), so NaN shows up as
        # the eps class alone.
        assert causes and causes <= {kind, "eps"} and (kind in causes or kind == "nan"), (kind, counts[kind])
    for cls in examples:
        assert all(p in SCHEDULE_CLASSES for p in cls.split("+")), cls


def test_schedule_survival_rounding(sg):
    """SGLang's sort survival is torch.cumprod in float32; ours is a left-to-right float32 product (the same on
    CPU and GPU). torch's CPU cumprod rounds differently from the third position on: within 3e-7 relative (about
    2 ulp), so the two orders can differ only between survivals that close; the first two positions agree bit for
    bit, and so do products that are exact (quantised confidences)."""
    rng = np.random.default_rng(7)
    conf = rng.uniform(0, 1, (400, 8)).astype(np.float32)
    d = torch.full((400,), 8, dtype=torch.int32)
    theirs = sg.schedule.compute_sort_survival(torch.from_numpy(conf))
    ours = av.prefix_survival(torch.from_numpy(conf), d)
    assert torch.equal(ours[:, :2], theirs[:, :2])
    assert torch.allclose(ours, theirs, rtol=3e-7, atol=0)
    assert not torch.equal(ours, theirs)  # the difference the docs describe is there
    q = torch.from_numpy((rng.integers(1, 5, (400, 8)) / 4).astype(np.float32))
    assert torch.equal(av.prefix_survival(q, d), sg.schedule.compute_sort_survival(q))


# ----------------------------------------------------------------------------------------------------------------
# SGLang's Triton kernels, interpreted on the CPU
# ----------------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def interpreted():
    """Runs the jobs through sglang_interpreted.py with TRITON_INTERPRET=1 (one subprocess for all)."""
    rng = np.random.default_rng(70)
    jobs, plans = [], []
    for R, D in ((1, 1), (3, 4), (6, 7)):
        s = make_step(seed=int(rng.integers(1 << 30)), R=R, K=D, budget=10 ** 6)  # every draft verified
        full = [len(x) == D for x in s["drafts_l"]]
        s["drafts"][:] = D  # a chain tree drafts every position: make the plan verify all D
        plan = av.plan_verification(av.prefix_survival(s["conf"], s["drafts"]), s["drafts"], mode="all",
                                    context_lens=s["ctx"], anchor_tokens=s["anchors"], draft_tokens=s["draft_tokens"])
        plans.append((s, plan, full))
        jobs.append(dict(op="chain_tree", bonus=s["anchors"].tolist(), draft=s["draft_tokens"].tolist(),
                         seq_lens=s["ctx"].tolist()))
    sched = []
    for kind in ("continuous", "quantised", "tiny"):
        conf = confidences(rng, 9, 5, kind)
        budget = int(rng.integers(0, 46))
        sched.append((conf, budget))
        jobs.append(dict(op="schedule", confidence=conf.tolist(), budget=budget, min_verify_len=1, max_verify_len=0,
                         survival_eps=1e-6))
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=os.pathsep.join(sys.path))
    proc = subprocess.run([sys.executable, str(HERE / "sglang_interpreted.py")], input=json.dumps(jobs),
                          capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout)
    return plans, out[: len(plans)], sched, out[len(plans):]


def test_chain_tree_is_verify_input(interpreted):
    """SGLang's EAGLE topk = 1 verify layout (build_chain_tree) equals our verify_input when every draft is
    verified, and its tree mask is the causal mask our varlen attention applies."""
    plans, trees, _, _ = interpreted
    for (s, plan, _), tree in zip(plans, trees):
        R, D = s["R"], s["K"]
        vi = avs.verify_input(plan, D, R)
        assert vi["draft_token"].tolist() == tree["tokens"]
        assert vi["positions"].tolist() == tree["positions"]
        assert vi["retrieve_index"].tolist() == tree["index"]
        assert vi["retrieve_next_token"].tolist() == tree["next"]
        assert vi["retrieve_next_sibling"].tolist() == tree["sibling"]
        W = D + 1
        mask = np.array(tree["mask"], dtype=bool).reshape(R, W, W)
        assert (mask == np.tril(np.ones((W, W), dtype=bool))[None]).all()
        # From SGLang's flattened tokens, chain_from_sglang recovers the plan's inputs.
        anchors, drafts_t, drafts = avs.chain_from_sglang(torch.tensor(tree["tokens"]), R)
        assert anchors.tolist() == s["anchors"].tolist() and drafts_t.tolist() == s["draft_tokens"].tolist()


def test_schedule_gpu_kernel_interpreted(sg, interpreted):
    """DSpark's Triton schedule kernel (what SGLang runs on CUDA tensors) gives our verify lengths too."""
    _, _, sched, outs = interpreted
    for (conf, budget), theirs in zip(sched, outs):
        ours = ours_schedule(conf, budget)
        assert theirs == sglang_schedule(sg, conf, budget)  # the kernel and SGLang's torch path
        assert classify_schedule(sg, conf, budget, ours, theirs, "tiny") in ("agree", "eps")


def test_verify_input_keys_are_eagle_verify_input_fields():
    """The chain verify_input's keys that name EagleVerifyInput fields are spelled as SGLang 0.5.23 spells them
    (``retrieve_*``; an earlier adapter wrote the kernels' ``retrive_*``). EagleVerifyInput does not import on a CPU
    torch, so its fields are read from eagle_info.py's source."""
    import ast
    import importlib.util

    source = Path(importlib.util.find_spec("sglang").submodule_search_locations[0]) / "srt/speculative/eagle_info.py"
    cls = next(n for n in ast.parse(source.read_text()).body if isinstance(n, ast.ClassDef)
               and n.name == "EagleVerifyInput")
    fields = {s.target.id for s in cls.body if isinstance(s, ast.AnnAssign)}
    R, K = 3, 4
    plan = av.plan_verification(torch.rand(R, K), torch.full((R,), K, dtype=torch.int32), mode="all",
                                context_lens=torch.tensor([5, 6, 7], dtype=torch.int32),
                                anchor_tokens=torch.zeros(R, dtype=torch.int32),
                                draft_tokens=torch.ones(R, K, dtype=torch.int32))
    keys = set(avs.verify_input(plan, K, R))
    for name in ("draft_token", "positions", "retrieve_index", "retrieve_next_token", "retrieve_next_sibling", "topk"):
        assert name in keys and name in fields, name
