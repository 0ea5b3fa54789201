"""adaptive_verify.integrations.vllm.patch_manager on the installed vLLM's AdaptiveVerificationManager (CPU).

The manager's constructor needs CUDA streams and events, and its record_confidences / set_cost_curves need CUDA
events and a tensor-parallel group: those parts are GPU-only and not run here. The manager below is a real
instance whose other state is what its constructor would allocate, on the CPU; its confidences are written
where record_confidences' copies would land. Two identical managers step through the same batches, one
patched: vLLM's own get_num_tokens / compact_batch / reallocate_drafts against ours.
"""
import types

import numpy as np
import pytest
import torch

import adaptive_verify as av
from adaptive_verify.integrations import vllm as avv
from peers import import_peer, require_peers, vllm_on_cpu

require_peers("vllm")

K = 4
MAX_REQS = 32
MAX_TOKENS = 512
CAPTURE = [1, 2, 4, 8, 16, 32, 64, 128]


@pytest.fixture(scope="module")
def vav():
    with pytest.MonkeyPatch.context() as mp:
        mod = import_peer("vllm.v1.worker.gpu.spec_decode.adaptive_verification")
        vllm_on_cpu(mp)
        # vLLM wraps the allocation in torch.compile (an inductor build on the CPU); the reference manager runs
        # the function it wraps.
        mp.setattr(mod, "_assign_draft_token_budget_compiled", mod._assign_draft_token_budget)
        yield mod


def tables(vav):
    verify = [(n, 5.0 + 0.01 * n) for n in CAPTURE] + [(192, 8.5), (256, 9.0), (512, 12.0)]
    draft = [(1, 0.5), (8, 0.55), (32, 0.7)]
    return vav.build_cost_tables_from_curves(draft, verify, MAX_REQS, MAX_TOKENS, CAPTURE[-1])


def cpu_manager(vav, *, max_total_logits=10 ** 6, copy_to_host=False):
    """A real AdaptiveVerificationManager with the state its constructor allocates, on the CPU (its CUDA stream
    and events left out), and a request table with the fields the manager reads."""
    cpu_gpu = import_peer("vllm.v1.utils").CpuGpuBuffer
    m = vav.AdaptiveVerificationManager.__new__(vav.AdaptiveVerificationManager)
    m.req_states = types.SimpleNamespace(
        max_num_reqs=MAX_REQS, num_speculative_steps=K, device=torch.device("cpu"), max_num_batched_tokens=MAX_TOKENS,
        req_id_to_index={}, num_computed_tokens_np=np.zeros(MAX_REQS, dtype=np.int32),
        prefill_len=types.SimpleNamespace(np=np.zeros(MAX_REQS, dtype=np.int32)))
    m.num_speculative_steps = K
    m.num_bonus_tokens = 1
    m._max_total_logits = max_total_logits
    m.query_start_loc = torch.zeros(MAX_REQS + 1, dtype=torch.int32)
    m.cost_tables = tables(vav)
    m._cudagraph_limit = CAPTURE[-1]
    m._batch_budget = None
    m._confidence_probs = torch.empty(MAX_REQS, K, dtype=torch.float32)
    m._batch_draft_capacity = torch.empty(MAX_REQS, dtype=torch.int32)
    m._num_non_draft_tokens = torch.empty_like(m.query_start_loc[:-1])
    m._cu_num_logits = torch.empty_like(m.query_start_loc)
    m._copy_admitted_drafts_to_host = copy_to_host
    m._stale_confidences = [cpu_gpu(MAX_REQS, K, dtype=torch.float32, device=torch.device("cpu"), pin_memory=False)
                            for _ in range(2)]
    m._pending_resets = []
    m._stale_idx = 0
    for slot in m._stale_confidences:
        slot.np.fill(1.0)
    return m


class Engine:
    """Requests in persistent slots, joining and leaving; each step's scheduled tokens and drafts."""

    def __init__(self, seed, managers, quantised=False):
        self.rng = np.random.default_rng(seed)
        self.managers = managers
        self.quantised = quantised
        self.live = {}  # req_id -> slot
        self.next_id = 0
        self.free = list(range(MAX_REQS))

    def conf(self, n):
        if self.quantised:
            return (self.rng.integers(1, 5, (n, K)) / 4).astype(np.float32)
        return self.rng.beta(3.0, 1.0, (n, K)).astype(np.float32)

    def step(self, prefill=False):
        rng = self.rng
        for r in [r for r in self.live if rng.random() < 0.2]:  # leave
            self.free.append(self.live.pop(r))
        for _ in range(int(rng.integers(0, 4))):  # join: vLLM's add_request gives them the prior (1.0)
            if self.free:
                slot = self.free.pop(int(rng.integers(len(self.free))))
                rid = f"req-{self.next_id}"
                self.next_id += 1
                self.live[rid] = slot
                for m in self.managers:
                    m.req_states.req_id_to_index[rid] = slot
                    m.add_request(slot)
        req_ids = list(self.live)
        rng.shuffle(req_ids)  # the runner's batch order is not the slot order
        R = len(req_ids)
        drafts = rng.integers(0, K + 1, R)
        drafts[rng.random(R) < 0.7] = K
        non_draft = np.ones(R, dtype=np.int64)
        if prefill and R:
            non_draft[-1] = int(rng.integers(2, 40))  # a prompt chunk (no drafts): it finishes its prompt
            drafts[-1] = 0
        # vLLM's runner puts verification requests first (sort_batch_req_ids; compact_batch asserts it).
        order = np.argsort(drafts == 0, kind="stable")
        req_ids, drafts, non_draft = [req_ids[i] for i in order], drafts[order], non_draft[order]
        slots = np.array([self.live[r] for r in req_ids], dtype=np.int64)
        # What record_confidences' copies would have delivered: stale (a step old) and live confidences.
        stale, live = self.conf(R), self.conf(R)
        for m in self.managers:
            for r, slot in zip(req_ids, slots):
                m.req_states.prefill_len.np[slot] = 0
            m._stale_confidences[m._stale_idx].np[slots] = stale
            m._confidence_probs[torch.from_numpy(slots)] = torch.from_numpy(live)
        num_tokens_per_req = {r: int(n + d) for r, n, d in zip(req_ids, non_draft, drafts)}
        draft_tokens = {r: [7] * int(d) for r, d in zip(req_ids, drafts) if d}
        return req_ids, slots, drafts.astype(np.int32), non_draft, num_tokens_per_req, draft_tokens, live


def run_step(m, req_ids, slots, drafts, non_draft, num_tokens_per_req, draft_tokens):
    """The manager's part of vLLM's model runner v2 step (prepare_inputs), in its order."""
    num_tokens = m.get_num_tokens(num_tokens_per_req, draft_tokens)
    scheduled = (non_draft + drafts).astype(np.int32)
    cu = np.concatenate([[0], np.cumsum(drafts + 1)]).astype(np.int32)
    compacted, _ = m.compact_batch(drafts, scheduled, cu)
    cu_logits, qsl, budget, admitted = m.reallocate_drafts(req_ids, torch.from_numpy(slots))
    R = len(req_ids)
    caps = m._batch_draft_capacity[:R].clone()
    return dict(num_tokens=num_tokens, compacted=compacted.tolist(), budget=budget, caps=caps.tolist(),
                cu_logits=cu_logits.tolist(), qsl=qsl[: R + 1].tolist(), qsl_pad=qsl[R + 1:].tolist(),
                admitted=admitted)


@pytest.mark.parametrize("prefill", [False, True])
def test_patched_manager_matches_vllm_on_continuous_confidences(vav, prefill):
    """Requests join (at vLLM's prior) and leave, the batch is shuffled: the patched manager chooses the same
    budget, admits the same drafts and writes the same cu_num_logits / query_start_loc as vLLM's own."""
    ref, ours = cpu_manager(vav), avv.patch_manager(cpu_manager(vav))
    eng = Engine(0, [ref, ours])
    budgets = []
    for _ in range(40):
        req_ids, slots, drafts, non_draft, ntpr, dt, live = eng.step(prefill=prefill)
        if not dt:
            continue
        a = run_step(ref, req_ids, slots, drafts, non_draft, ntpr, dt)
        b = run_step(ours, req_ids, slots, drafts, non_draft, ntpr, dt)
        for k in ("num_tokens", "compacted", "budget", "caps", "cu_logits", "qsl", "qsl_pad"):
            assert a[k] == b[k], (k, a[k], b[k])
        budgets.append(b["budget"])
        # Metadata from our planner: on a decode-only step, query_start_loc is the plan's own.
        if not prefill:
            d = torch.from_numpy(drafts)
            plan = av.plan_verification(av.prefix_survival(torch.from_numpy(live), d), d, mode="fixed",
                                        budget=b["budget"])
            assert b["qsl"] == plan.query_start_loc.tolist() and b["caps"] == plan.verify_lens.tolist()
    # The steps exercised both a binding budget and verify-everything.
    assert any(0 < x for x in budgets) and len(set(budgets)) > 3


def test_patched_manager_ties_are_canonical(vav):
    """Quantised confidences tie across requests: the budget is still vLLM's, and the admitted drafts go to the
    tied requests in canonical order (survival desc, position asc, request asc: the same on every TP rank),
    taking the same survivals as vLLM's topk."""
    ref, ours = cpu_manager(vav), avv.patch_manager(cpu_manager(vav))
    eng = Engine(1, [ref, ours], quantised=True)
    tie_steps = 0
    for _ in range(40):
        req_ids, slots, drafts, non_draft, ntpr, dt, live = eng.step()
        if not dt:
            continue
        a = run_step(ref, req_ids, slots, drafts, non_draft, ntpr, dt)
        b = run_step(ours, req_ids, slots, drafts, non_draft, ntpr, dt)
        assert a["budget"] == b["budget"] and sum(a["caps"]) == sum(b["caps"]) == b["budget"]
        s = np.cumprod(live, axis=1)
        taken = lambda caps: sorted(float(s[r, j]) for r, L in enumerate(caps) for j in range(L))  # noqa: E731
        assert taken(a["caps"]) == taken(b["caps"])
        d = torch.from_numpy(drafts)
        plan = av.plan_verification(av.prefix_survival(torch.from_numpy(live), d), d, mode="fixed", budget=b["budget"])
        assert b["caps"] == plan.verify_lens.tolist()
        tie_steps += a["caps"] != b["caps"]
    assert tie_steps > 0  # vLLM's topk broke some ties differently: the test saw the difference it is about


def test_patched_manager_logit_capacity_and_host_counts(vav):
    """vLLM's logit-row cap binds the patched budget the same way; with copy_admitted_drafts_to_host the CPU
    manager hands back the admitted counts through vLLM's wait() interface."""
    ours = avv.patch_manager(cpu_manager(vav, max_total_logits=24, copy_to_host=True))
    eng = Engine(2, [ours])
    seen = 0
    for _ in range(30):
        req_ids, slots, drafts, non_draft, ntpr, dt, live = eng.step()
        if not dt:
            continue
        b = run_step(ours, req_ids, slots, drafts, non_draft, ntpr, dt)
        assert b["budget"] <= max(0, 24 - len(req_ids))
        if b["admitted"] is not None:
            assert b["admitted"].wait().tolist() == b["caps"]
            seen += 1
        else:
            assert b["budget"] in (0, int(drafts.sum()))
    assert seen > 0


def test_patched_manager_nan_confidence(vav):
    """A NaN live confidence: the draft and the request's later ones rank last (survival 0), never first as in
    vLLM's topk, and every budget slot still goes to a real draft."""
    ours = avv.patch_manager(cpu_manager(vav))
    for i, rid in enumerate(["a", "b"]):
        ours.req_states.req_id_to_index[rid] = i
    ours._stale_confidences[0].np[:2] = 0.9
    ours._confidence_probs[:2] = torch.tensor([[float("nan"), 0.9, 0.9, 0.9], [0.8, 0.7, 0.6, 0.5]])
    ours.get_num_tokens({"a": 1 + K, "b": 1 + K}, {"a": [1] * K, "b": [1] * K})
    ours._batch_budget = (ours._batch_budget[0], ours._batch_budget[1], 3)  # a budget that binds
    _, qsl, budget, _ = ours.reallocate_drafts(["a", "b"], torch.tensor([0, 1]))
    assert budget == 3 and ours._batch_draft_capacity[:2].tolist() == [0, 3]
    assert qsl[:3].tolist() == [0, 1, 5]


def test_patch_manager_checks_and_is_idempotent(vav):
    m = cpu_manager(vav)
    assert avv.patch_manager(m) is m
    first = m.get_num_tokens
    assert avv.patch_manager(m).get_num_tokens is first
    bare = types.SimpleNamespace(cost_tables=None)
    with pytest.raises(ValueError, match="req_states"):
        avv.patch_manager(bare)
    m2 = avv.patch_manager(cpu_manager(vav))
    m2.cost_tables = None
    with pytest.raises(RuntimeError, match="cost_tables"):
        m2.get_num_tokens({"x": 1}, {"x": []})
    with pytest.raises(RuntimeError, match="get_num_tokens"):
        avv.patch_manager(cpu_manager(vav)).reallocate_drafts([], torch.zeros(0, dtype=torch.int64))


def test_adaptive_verifier_matches_vllm_budget_with_joining_requests(vav):
    """This library's own AdaptiveVerifier (lagged mode, request identity, prior 1.0 for a new slot) against
    vLLM's manager on decode-only steps: the same budget when both rank the same stale confidences."""
    ref = cpu_manager(vav)
    table = avv.cost_table_from_vllm(ref.cost_tables)
    v = av.AdaptiveVerifier(table, max_reqs=MAX_REQS, max_drafts=K, block_size=16, graph_sizes=CAPTURE)
    eng = Engine(3, [ref])
    compared = 0
    for _ in range(40):
        before = set(eng.live)
        req_ids, slots, drafts, non_draft, ntpr, dt, live = eng.step()
        new = [eng.live[r] for r in eng.live if r not in before]
        if new:
            v.add_request(new)
        # Both sides rank the same stale confidences: ours recorded for the requests that have history.
        old = [i for i, r in enumerate(req_ids) if r in before]
        if old:
            v.record_confidence(torch.from_numpy(ref._stale_confidences[0].np[slots[old]].copy()),
                                req_indices=slots[old])
        if not dt:
            continue
        budget, padded = v.plan_budget(len(req_ids), drafts, req_indices=slots)
        assert budget == run_step(ref, req_ids, slots, drafts, non_draft, ntpr, dt)["budget"]
        assert padded == next((g for g in CAPTURE if g >= len(req_ids) + budget), len(req_ids) + budget)
        compared += 1
    assert compared > 20
