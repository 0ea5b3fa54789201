"""The planner's grouped per-step inputs (adaptive_verify.PlanStep, adaptive_verify.MetadataInputs).

A call with ``step=`` / ``metadata=`` must be the call its keywords make: the same plan (every field, every mode,
chains and trees, fresh and remembered), the same budget from ``choose_budget``; a field given both ways is a
ValueError naming both; a wrong type a TypeError naming the field; a bad value the ops' own ValueError, naming the
field. Under torch.compile the grouped call still traces into the planner's custom op.
"""
import dataclasses

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import adaptive_verify as av

pytestmark = pytest.mark.filterwarnings("ignore:plan_verification\\(mode='global'\\):UserWarning")

SETTINGS = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
STEP_FIELDS = tuple(f.name for f in dataclasses.fields(av.PlanStep))
METADATA_FIELDS = tuple(f.name for f in dataclasses.fields(av.MetadataInputs))
BLOCK_SIZE = 4


def table(max_tokens=None):
    return av.CostTable.from_points({1: 1.0, 16: 1.5, 64: 4.0, 512: 30.0}, draft_ms=0.7, max_tokens=max_tokens)


# ----------------------------------------------------------------------------------------------------------
# random steps: every field of both objects drawn, each sometimes left at its default
# ----------------------------------------------------------------------------------------------------------


@st.composite
def steps(draw, tree: bool):
    """(op's positional inputs, step keywords, metadata keywords, mode, cost table) of one random valid step."""
    seed = draw(st.integers(0, 2**32 - 1))
    g = torch.Generator().manual_seed(seed)
    R = draw(st.integers(0, 9))
    K = draw(st.integers(1, 12 if tree else 8))
    mode = draw(st.sampled_from(("greedy", "global", "fixed", "fixed_tensor", "all")))
    conf = torch.rand(R, K, generator=g) * 0.7 + 0.3
    drafts = torch.randint(0, K + 1, (R,), generator=g, dtype=torch.int32)
    if tree:  # a random topology: node j's parent is -1 (the anchor) or an earlier node
        parents = torch.stack([torch.randint(-1, max(j, 0), (R,), generator=g, dtype=torch.int32) if j else
                               torch.full((R,), -1, dtype=torch.int32) for j in range(K)], 1).contiguous()
        survival = av.tree_survival(conf, parents, drafts)
    else:
        parents = None
        survival = av.prefix_survival(conf, drafts)

    min_verify = draw(st.integers(0, K))
    max_verify = draw(st.one_of(st.none(), st.integers(min_verify, K)))
    mv = K if max_verify is None else max_verify
    extra_tokens = draw(st.sampled_from((0, 0, 3, 17)))
    max_cap = R * mv
    capacity = draw(st.one_of(st.none(), st.integers(R + extra_tokens, R + extra_tokens + max_cap + 2)))
    step = dict(min_verify=min_verify, max_verify=max_verify, extra_tokens=extra_tokens,
                extra_emitting=draw(st.sampled_from((0, 0, 2))), capacity=capacity,
                max_step_ms=draw(st.one_of(st.none(), st.floats(1.0, 6.0))),
                weights=torch.rand(R, generator=g) * 2 if draw(st.booleans()) else None,
                num_reqs_padded=draw(st.one_of(st.none(), st.integers(R, R + 3))),
                num_tokens_padded=draw(st.one_of(st.none(), st.integers(max(R, 1), R + max_cap + 3))))
    if mode == "fixed":
        step["budget"] = draw(st.integers(0, max_cap + 2))
    elif mode == "fixed_tensor":
        step["budget"] = torch.tensor(draw(st.integers(0, max_cap + 2)), dtype=torch.int32)

    metadata = {}
    if draw(st.booleans()):
        context = torch.randint(0, 40, (R,), generator=g, dtype=torch.int32)
        metadata.update(context_lens=context, token_offset=draw(st.sampled_from((0, 5))))
        if draw(st.booleans()):
            blocks = (40 + K + 1) // BLOCK_SIZE + 1
            metadata.update(block_table=torch.randperm(R * blocks, generator=g).to(torch.int32).view(R, blocks),
                            block_size=BLOCK_SIZE)
    if draw(st.booleans()):
        # distinct ids per request, so sibling ids differ; sometimes one invalidated draft (-1) ends a branch
        tokens = torch.stack([torch.randperm(100, generator=g)[:K] for _ in range(R)]).to(torch.int32) \
            if R else torch.empty(0, K, dtype=torch.int32)
        if R and draw(st.booleans()):
            tokens[0, K // 2] = -1
        metadata["draft_tokens"] = tokens.contiguous()
        if draw(st.booleans()):
            metadata["anchor_tokens"] = torch.randint(0, 100, (R,), generator=g, dtype=torch.int32)
    ct = table(max_tokens=draw(st.sampled_from((None, 4096))))
    return (survival, parents, drafts), step, metadata, "fixed" if mode == "fixed_tensor" else mode, ct


def plan(inputs, ct, mode, out=None, step=None, metadata=None, **kw):
    survival, parents, drafts = inputs
    if parents is None:
        return av.plan_verification(survival, drafts, ct, mode=mode, verification="onehot", out=out, step=step,
                                    metadata=metadata, **kw)
    return av.plan_tree_verification(survival, parents, drafts, ct, mode=mode, out=out, step=step,
                                     metadata=metadata, **kw)


def assert_same_plan(got, want):
    assert type(got) is type(want)
    for f in dataclasses.fields(want):
        a, b = getattr(got, f.name), getattr(want, f.name)
        assert (a is None) == (b is None), f.name
        if b is not None:
            assert a.dtype == b.dtype and torch.equal(a, b), f.name


def split(fields: dict, keep: set):
    """(fields named in keep, the rest)."""
    return {k: v for k, v in fields.items() if k in keep}, {k: v for k, v in fields.items() if k not in keep}


@pytest.mark.parametrize("tree", [False, True], ids=["chain", "tree"])
@settings(max_examples=60, **SETTINGS)
@given(data=st.data())
def test_grouped_plan_equals_keyword_plan(tree, data):
    """Every mode (fixed with an int and a tensor budget), with and without metadata: the objects, the keywords and
    any split between the two give the same plan, fresh, repeated with ``out=``, and through a prepared call."""
    inputs, step, metadata, mode, ct = data.draw(steps(tree))
    want = plan(inputs, ct, mode, **step, **metadata)
    assert_same_plan(plan(inputs, ct, mode, step=av.PlanStep(**step), metadata=av.MetadataInputs(**metadata)), want)
    # a split: some fields in the objects, the rest as keywords
    in_step, step_kw = split(step, set(data.draw(st.sets(st.sampled_from(STEP_FIELDS)))))
    in_meta, meta_kw = split(metadata, set(data.draw(st.sets(st.sampled_from(METADATA_FIELDS)))))
    assert_same_plan(plan(inputs, ct, mode, step=av.PlanStep(**in_step), metadata=av.MetadataInputs(**in_meta),
                          **step_kw, **meta_kw), want)
    # with out=: the grouped and the keyword call, each repeated; then each prepared and run twice
    kind = av.TreeVerifyPlan if tree else av.VerifyPlan
    out = kind.allocate(want.verify_lens.shape[0], want.token_req.shape[0], positions=want.positions is not None,
                        slot_mapping=want.slot_mapping is not None, input_ids=want.input_ids is not None)
    grouped = dict(step=av.PlanStep(**step), metadata=av.MetadataInputs(**metadata))
    for kwargs in (grouped, dict(**step, **metadata), grouped, dict(**step, **metadata)):
        assert_same_plan(plan(inputs, ct, mode, out=out, **kwargs), want)
    survival, parents, drafts = inputs
    for kwargs in (grouped, dict(**step, **metadata)):
        if parents is None:
            handle = av.prepare(av.plan_verification, survival, drafts, ct, mode=mode, verification="onehot",
                                out=out, **kwargs)
        else:
            handle = av.prepare(av.plan_tree_verification, survival, parents, drafts, ct, mode=mode, out=out,
                                **kwargs)
        for _ in range(2):
            assert_same_plan(handle.run(), want)


@pytest.mark.parametrize("tree", [False, True], ids=["chain", "tree"])
@settings(max_examples=40, **SETTINGS)
@given(data=st.data())
def test_grouped_choose_budget_equals_keywords(tree, data):
    inputs, step, metadata, mode, ct = data.draw(steps(tree))
    mode = mode if mode != "fixed" else "global"
    step = {k: v for k, v in step.items() if k not in ("budget", "num_tokens_padded")}
    keywords = {k: v for k, v in step.items() if k != "num_reqs_padded"}  # a step's R_pad is not read here
    survival, parents, drafts = inputs
    want = av.choose_budget(survival, drafts, ct, mode=mode, parents=parents,
                            draft_tokens=metadata.get("draft_tokens"), **keywords)
    # the whole metadata (only its draft_tokens are read) and the whole step
    got = av.choose_budget(survival, drafts, ct, mode=mode, parents=parents, step=av.PlanStep(**step),
                           metadata=av.MetadataInputs(**metadata))
    assert got.dtype == want.dtype and int(got) == int(want)


def test_choose_budget_reads_the_draft_tokens_of_metadata():
    """An invalidated draft (-1) in metadata.draft_tokens ends its request's candidates, as the keyword does."""
    survival = torch.full((2, 4), 0.9)
    drafts = torch.tensor([4, 4], dtype=torch.int32)
    tokens = torch.tensor([[5, -1, 7, 8], [1, 2, 3, 4]], dtype=torch.int32)
    budget = av.choose_budget(survival, drafts, None, mode="all", metadata=av.MetadataInputs(draft_tokens=tokens))
    assert int(budget) == 1 + 4
    assert int(budget) == int(av.choose_budget(survival, drafts, None, mode="all", draft_tokens=tokens))


@pytest.mark.parametrize("name", ["budget", "num_tokens_padded"])
def test_choose_budget_refuses_the_fields_it_does_not_apply(name):
    survival, drafts = torch.full((2, 3), 0.5), torch.tensor([3, 3], dtype=torch.int32)
    with pytest.raises(ValueError, match=rf"^step\.{name} must be None for choose_budget"):
        av.choose_budget(survival, drafts, table(), step=av.PlanStep(**{name: 4}))


def test_a_persistent_step_follows_its_tensors_values_and_replace():
    """Objects built once around persistent tensors: in-place updates of those tensors and dataclasses.replace of
    the host fields give each step the plan its keywords give (out= reused every step)."""
    g = torch.Generator().manual_seed(3)
    R, K = 6, 5
    drafts = torch.full((R,), K, dtype=torch.int32)
    survival, weights = torch.empty(R, K), torch.empty(R)
    context, tokens = torch.empty(R, dtype=torch.int32), torch.empty(R, K, dtype=torch.int32)
    budget = torch.zeros((), dtype=torch.int32)
    ct = table()
    step = av.PlanStep(budget=budget, weights=weights, min_verify=1)
    metadata = av.MetadataInputs(context_lens=context, draft_tokens=tokens)
    out = av.VerifyPlan.allocate(R, R * (K + 1), positions=True)
    for i in range(6):
        survival.copy_(av.prefix_survival(torch.rand(R, K, generator=g), drafts))
        weights.copy_(torch.rand(R, generator=g))
        context.copy_(torch.randint(0, 50, (R,), generator=g))
        tokens.copy_(torch.randint(-1 if i % 2 else 0, 9, (R, K), generator=g))
        budget.fill_(int(torch.randint(0, R * K, (), generator=g)))
        step = dataclasses.replace(step, extra_tokens=i) if i % 3 == 2 else step
        got = av.plan_verification(survival, drafts, ct, mode="fixed", step=step, metadata=metadata, out=out)
        want = av.plan_verification(survival.clone(), drafts, ct, mode="fixed", budget=budget.clone(),
                                    weights=weights.clone(), min_verify=1, extra_tokens=step.extra_tokens,
                                    context_lens=context.clone(), draft_tokens=tokens.clone())
        assert_same_plan(got, want)


# ----------------------------------------------------------------------------------------------------------
# conflicts, types, values
# ----------------------------------------------------------------------------------------------------------

#: A value off the default for each field (a conflict needs both sides given).
STEP_VALUES = dict(budget=2, min_verify=1, max_verify=2, capacity=20, extra_tokens=1, extra_emitting=1,
                   max_step_ms=5.0, weights=torch.ones(2), num_reqs_padded=3, num_tokens_padded=8)
METADATA_VALUES = dict(context_lens=torch.zeros(2, dtype=torch.int32),
                       block_table=torch.zeros(2, 4, dtype=torch.int32), block_size=16,
                       anchor_tokens=torch.zeros(2, dtype=torch.int32),
                       draft_tokens=torch.zeros(2, 3, dtype=torch.int32), token_offset=4)


def chain_and_tree_planners():
    survival, drafts = torch.full((2, 3), 0.5), torch.tensor([3, 3], dtype=torch.int32)
    parents = torch.tensor([[-1, 0, 1]] * 2, dtype=torch.int32)
    return [lambda **kw: av.plan_verification(survival, drafts, table(), mode="fixed", **kw),
            lambda **kw: av.plan_tree_verification(survival, parents, drafts, table(), mode="fixed", **kw)]


def test_the_value_tables_cover_every_field():
    assert set(STEP_VALUES) == set(STEP_FIELDS) and set(METADATA_VALUES) == set(METADATA_FIELDS)


@pytest.mark.parametrize("name", STEP_FIELDS)
def test_a_step_field_given_both_ways_raises_naming_both(name):
    value = STEP_VALUES[name]
    for call in chain_and_tree_planners():
        with pytest.raises(ValueError, match=rf"^{name}= and step\.{name} are both given"):
            call(step=av.PlanStep(**{name: value}), **{name: value})


@pytest.mark.parametrize("name", METADATA_FIELDS)
def test_a_metadata_field_given_both_ways_raises_naming_both(name):
    value = METADATA_VALUES[name]
    for call in chain_and_tree_planners():
        with pytest.raises(ValueError, match=rf"^{name}= and metadata\.{name} are both given"):
            call(budget=1, metadata=av.MetadataInputs(**{name: value}), **{name: value})


def test_every_conflict_is_named_and_choose_budget_checks_too():
    with pytest.raises(ValueError, match=r"^min_verify= and step\.min_verify and capacity= and step\.capacity are"):
        chain_and_tree_planners()[0](step=av.PlanStep(min_verify=1, capacity=9, budget=1), min_verify=2, capacity=9)
    survival, drafts = torch.full((2, 3), 0.5), torch.tensor([3, 3], dtype=torch.int32)
    with pytest.raises(ValueError, match=r"^weights= and step\.weights are both given"):
        av.choose_budget(survival, drafts, table(), step=av.PlanStep(weights=torch.ones(2)), weights=torch.ones(2))
    tokens = torch.zeros(2, 3, dtype=torch.int32)
    with pytest.raises(ValueError, match=r"^draft_tokens= and metadata\.draft_tokens are both given"):
        av.choose_budget(survival, drafts, table(), metadata=av.MetadataInputs(draft_tokens=tokens),
                         draft_tokens=tokens)


def test_a_keyword_at_its_default_leaves_the_field_and_zero_budgets_are_given():
    """0 is the default of min_verify, extra_tokens, extra_emitting and token_offset (the object's field then
    counts); a budget, capacity or max_verify of 0 is a value (default None), so it conflicts."""
    survival, drafts = torch.full((2, 3), 0.5), torch.tensor([3, 3], dtype=torch.int32)
    got = av.plan_verification(survival, drafts, mode="all", min_verify=0, step=av.PlanStep(min_verify=2),
                               token_offset=0, metadata=av.MetadataInputs(token_offset=7))
    want = av.plan_verification(survival, drafts, mode="all", min_verify=2, token_offset=7)
    assert_same_plan(got, want)
    for name in ("budget", "capacity", "max_verify"):
        with pytest.raises(ValueError, match=rf"^{name}= and step\.{name}"):
            av.plan_verification(survival, drafts, mode="fixed", step=av.PlanStep(**{name: 1}), **{name: 0})


#: A wrong type for each field.
STEP_WRONG = dict(budget=2.0, min_verify=True, max_verify="2", capacity=1.5, extra_tokens=None, extra_emitting=1.0,
                  max_step_ms=torch.tensor(1.0), weights=[1.0, 1.0], num_reqs_padded=3.0, num_tokens_padded=False)
METADATA_WRONG = dict(context_lens=[0, 0], block_table=((0,),), block_size=16.0, anchor_tokens=3,
                      draft_tokens="tokens", token_offset=None)


@pytest.mark.parametrize("name", STEP_FIELDS)
def test_a_step_field_of_a_wrong_type_raises_naming_it(name):
    with pytest.raises(TypeError, match=rf"^PlanStep\.{name} must be"):
        av.PlanStep(**{name: STEP_WRONG[name]})


@pytest.mark.parametrize("name", METADATA_FIELDS)
def test_a_metadata_field_of_a_wrong_type_raises_naming_it(name):
    with pytest.raises(TypeError, match=rf"^MetadataInputs\.{name} must be"):
        av.MetadataInputs(**{name: METADATA_WRONG[name]})


def test_an_object_of_the_wrong_class_raises_naming_the_argument():
    survival, drafts = torch.full((2, 3), 0.5), torch.tensor([3, 3], dtype=torch.int32)
    for call in chain_and_tree_planners():
        with pytest.raises(TypeError, match=r"^step must be an adaptive_verify\.PlanStep, got dict"):
            call(step=dict(budget=1))
        with pytest.raises(TypeError, match=r"^metadata must be an adaptive_verify\.MetadataInputs, got PlanStep"):
            call(budget=1, metadata=av.PlanStep())
    with pytest.raises(TypeError, match=r"^step must be an adaptive_verify\.PlanStep"):
        av.choose_budget(survival, drafts, table(), step=av.MetadataInputs())


@pytest.mark.parametrize("fields, message", [
    (dict(min_verify=-1), r"^min_verify must be >= 0"),
    (dict(max_verify=9), r"^max_verify must be <= 3"),
    (dict(extra_tokens=-2), r"^extra_tokens must be >= 0"),
    (dict(budget=-1), r"^budget must be >= 0"),
    (dict(num_reqs_padded=1), r"^num_reqs_padded must be >= 2"),
    (dict(weights=torch.ones(3)), r"^weights"),
    (dict(max_step_ms=0.0), r"^max_step_ms must be > 0"),
])
def test_values_are_checked_by_the_ops_naming_the_field(fields, message):
    fields = {"budget": 1, **fields}
    with pytest.raises(ValueError, match=message):
        chain_and_tree_planners()[0](step=av.PlanStep(**fields))


def test_a_bad_metadata_value_is_named_by_the_op():
    with pytest.raises(ValueError, match=r"^block_size must be >= 1"):
        chain_and_tree_planners()[1](budget=1, metadata=av.MetadataInputs(block_size=0))
    with pytest.raises(ValueError, match=r"^context_lens"):
        chain_and_tree_planners()[0](budget=1,
                                     metadata=av.MetadataInputs(context_lens=torch.zeros(3, dtype=torch.int32)))


def test_the_objects_are_frozen():
    step = av.PlanStep(budget=1)
    with pytest.raises(dataclasses.FrozenInstanceError):
        step.budget = 2
    assert dataclasses.replace(step, budget=2).budget == 2 and step.budget == 1


# ----------------------------------------------------------------------------------------------------------
# torch.compile
# ----------------------------------------------------------------------------------------------------------


def test_grouped_plan_compiles_fullgraph_into_the_planner_op():
    """The objects built outside and inside the compiled function: traced through the plan_into custom op, with
    eager's integers."""
    dynamo = pytest.importorskip("torch._dynamo")
    g = torch.Generator().manual_seed(1)
    R, K = 3, 4
    conf = torch.rand(R, K, generator=g) * 0.6 + 0.4
    drafts = torch.tensor([4, 2, 3], dtype=torch.int32)
    context = torch.tensor([5, 17, 0], dtype=torch.int32)
    block_table = torch.arange(R * 4, dtype=torch.int32).view(R, 4)
    ct = table()
    metadata = av.MetadataInputs(context_lens=context, block_table=block_table, block_size=16, token_offset=2)
    step = av.PlanStep(min_verify=1, num_tokens_padded=R * (K + 1))

    def outside(conf, drafts):
        plan = av.plan_verification(av.prefix_survival(conf, drafts), drafts, ct, mode="greedy", step=step,
                                    metadata=metadata)
        return plan.verify_lens, plan.query_start_loc, plan.slot_mapping

    def inside(conf, drafts, context):
        plan = av.plan_verification(av.prefix_survival(conf, drafts), drafts, ct, mode="greedy",
                                    step=av.PlanStep(min_verify=1),
                                    metadata=av.MetadataInputs(context_lens=context, block_table=block_table,
                                                               block_size=16))
        return plan.verify_lens, plan.positions, plan.slot_mapping

    for fn, args in ((outside, (conf, drafts)), (inside, (conf, drafts, context))):
        eager = fn(*args)
        dynamo.reset()
        compiled = torch.compile(fn, fullgraph=True)(*args)
        for e, c in zip(eager, compiled):
            assert e.dtype == c.dtype and torch.equal(e, c)
        explained = dynamo.explain(fn)(*args)
        assert explained.graph_break_count == 0
        ops = " ".join(str(n.target) for gm in explained.graphs for n in gm.graph.nodes if n.op == "call_function")
        assert "plan_into" in ops
