"""The draft depth (AdaptiveVerifier.plan_draft) handed to the installed engines' own structures (CPU):

- vLLM: ``SchedulerOutput.num_spec_tokens_to_schedule`` (dynamic speculative decoding's K), which the model runner
  passes as the first argument of the proposer's ``propose(num_speculative_tokens, ...)``: schedule_draft_depth
  writes it on a real SchedulerOutput, and the proposer's signature is checked to take it where we say;
- SGLang: its ``AdaptiveController`` (adaptive_runtime_state) driven by DraftDepthPolicy switches a worker to the
  runtime state of the decided depth, through SGLang's own code.
"""
import dataclasses
import inspect

import numpy as np
import pytest
import torch

import adaptive_verify as av
from adaptive_verify.integrations import sglang as avs
from adaptive_verify.integrations import vllm as avv
from peers import import_peer, missing

K = 6


def verifier(mode="lagged"):
    table = av.CostTable.from_points({1: 5.0, 64: 5.2, 256: 6.0, 1024: 9.0}, {1: 3.0}, graph_sizes=(8, 16, 32, 64),
                                     max_tokens=1024, draft_levels=K, draft_level_ms=0.4, draft_catch_up=True)
    return av.AdaptiveVerifier(table, max_reqs=16, max_drafts=K, block_size=16, mode=mode)


@pytest.mark.skipif(bool(missing("vllm")), reason="peer vllm not installed (tests/integration/install_peers.sh)")
def test_vllm_scheduler_output_takes_the_depth():
    output = import_peer("vllm.v1.core.sched.output")
    proposer = import_peer("vllm.v1.spec_decode.llm_base_proposer")
    fields = {f.name: f for f in dataclasses.fields(output.SchedulerOutput)}
    assert fields["num_spec_tokens_to_schedule"].default == 0
    assert list(inspect.signature(proposer.SpecDecodeBaseProposer.propose).parameters)[1] == "num_speculative_tokens"
    required = {f.name: None for f in fields.values()
                if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING}
    so = output.SchedulerOutput(**required)  # (a real object; the fields the depth does not touch left None)
    depth, budget, _ = verifier().plan_draft(8)
    avv.schedule_draft_depth(so, depth)
    assert so.num_spec_tokens_to_schedule == depth == K  # no history: the prior says every level pays
    avv.schedule_draft_depth(so, 0)
    assert so.num_spec_tokens_to_schedule == 0
    with pytest.raises(TypeError, match="scheduler_output"):
        avv.schedule_draft_depth(object(), 2)
    with pytest.raises(ValueError, match="depth"):
        avv.schedule_draft_depth(so, -1)


class _Worker:
    """SGLang's AdaptiveSpecWorker protocol, recording the runtime state it is switched to."""

    def __init__(self, steps):
        self.speculative_num_steps = steps

    def build_adaptive_runtime_state(self, speculative_num_steps, speculative_num_draft_tokens, cuda_graph_bs=None):
        sglang = import_peer("sglang.srt.speculative.adaptive_runtime_state")
        return sglang.SpecRuntimeState(speculative_num_steps, speculative_num_draft_tokens, None, None, "target", None,
                                       None, None)

    def apply_runtime_state(self, state):
        self.speculative_num_steps = state.speculative_num_steps


@pytest.mark.skipif(bool(missing("sglang")), reason="peer sglang not installed (tests/integration/install_peers.sh)")
def test_sglang_controller_switches_to_the_decided_depth():
    sglang = import_peer("sglang.srt.speculative.adaptive_runtime_state")
    v = verifier()
    policy = avs.DraftDepthPolicy(v, [1, 3, 6])
    worker = _Worker(6)
    controller = sglang.AdaptiveController(worker, policy)
    controller.init_states([1, 2, 4, 8])
    assert policy.candidate_steps == [1, 3, 6] and policy.cuda_graph_bs_for_step(3) == [1, 2, 4, 8]
    rng = np.random.default_rng(0)
    served = set()
    for accept in [0.9] * 10 + [0.2] * 40:
        depth, budget, padded = policy.decide(8)
        controller.activate_step_by_batch(8)
        assert worker.speculative_num_steps == min(k for k in (1, 3, 6) if k >= max(depth, 1))
        served.add(worker.speculative_num_steps)
        if depth:  # the engine drafts worker.speculative_num_steps levels; the planner sees the decided depth
            conf = np.full((8, depth), accept, dtype=np.float32)
            v.record_confidence(torch.from_numpy(conf))
            plan = v.plan(torch.from_numpy(conf), torch.full((8,), depth, dtype=torch.int32), budget=budget)
            accepted = (rng.random((8, depth)) < accept).cumprod(1).sum(1).astype(np.int32)
            v.observe(plan.verify_lens, torch.from_numpy(np.minimum(accepted, plan.verify_lens[:8].numpy())))
        controller.on_verify_complete([0] * 8, 8)  # the policy leaves switching to decide()
    assert len(served) >= 2, served
    with pytest.raises(ValueError, match="candidate_steps"):
        avs.DraftDepthPolicy(v, [])


@pytest.mark.skipif(bool(missing("sglang")), reason="peer sglang not installed (tests/integration/install_peers.sh)")
def test_sglang_controller_serves_the_decided_tree_depth():
    """decide_tree: plan_tree_draft's depth switches SGLang's controller like a chain's; the width is reported."""
    sglang = import_peer("sglang.srt.speculative.adaptive_runtime_state")
    ct = av.CostTable.from_points({1: 5.0, 64: 5.2, 256: 6.0, 1024: 9.0}, {1: 1.6}, max_tokens=2048, draft_levels=4,
                                  draft_level_ms=0.3)
    k, R = 2, 8
    v = av.AdaptiveVerifier(ct, max_reqs=R, max_drafts=4, block_size=16, max_nodes=14, tree_top_k=k)
    policy = avs.DraftDepthPolicy(v, [1, 2, 4])
    worker = _Worker(4)
    controller = sglang.AdaptiveController(worker, policy)
    controller.init_states([8])
    served = set()
    for accept in [0.95] * 8 + [0.05] * 30:
        depth, width, budget, padded = policy.decide_tree(R)
        controller.activate_step_by_batch(R)
        assert worker.speculative_num_steps == min(s for s in (1, 2, 4) if s >= max(depth, 1)) and 1 <= width <= k
        served.add(worker.speculative_num_steps)
        if not depth:
            continue
        # the worker's tree: level 1 the anchor's k children, then k children of each of the first `width` nodes of
        # the level before (already in path-confidence order: siblings' confidences fall with their index)
        parents, level, conf = [-1] * k, list(range(k)), [accept * 0.9 ** i for i in range(k)]
        for _ in range(depth - 1):
            nxt = []
            for p in level[:width]:
                for i in range(k):
                    parents.append(p)
                    conf.append(accept * 0.9 ** i)
                    nxt.append(len(parents) - 1)
            level = nxt
        n = len(parents)
        conf_t = torch.tensor([conf] * R, dtype=torch.float32)
        par_t = torch.tensor([parents] * R, dtype=torch.int32)
        sizes = torch.full((R,), n, dtype=torch.int32)
        v.record_confidence(conf_t, parents=par_t, tree_sizes=sizes)
        plan = v.plan(conf_t, sizes, budget=budget, parents=par_t)
        offs = torch.full((R, n + 1), -1, dtype=torch.int32)
        offs[:, 0] = 0
        v.observe(plan.verify_lens, torch.zeros(R, dtype=torch.int32), accepted_offsets=offs)
    assert len(served) >= 2, served
