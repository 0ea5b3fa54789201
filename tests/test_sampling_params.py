"""SamplingParams: the per-request sampling parameters of rejection_sample, tree_rejection_sample and sample in one
object. It must give exactly the keywords' tokens (seeded, random batches, with the remembered out= path), refuse
a parameter given both ways (naming both), name the field of a wrong type, and trace under torch.compile."""
import dataclasses

import pytest
import torch

import adaptive_verify as av
from test_sampling import _random_batch
from test_sampling_tree import planned_step, settings

FIELDS = ("temperature", "top_k", "top_p", "min_p", "seeds")


def _truncation(g, n):
    """Per-request top_k / top_p / min_p, each switched off for some requests."""
    top_k = torch.where(torch.rand(n, generator=g) < 0.3, 0, torch.randint(1, 9, (n,), generator=g)).to(torch.int32)
    top_p = torch.where(torch.rand(n, generator=g) < 0.3, 1.0, torch.rand(n, generator=g) * 0.9 + 0.05)
    min_p = torch.where(torch.rand(n, generator=g) < 0.3, 0.0, torch.rand(n, generator=g) * 0.3)
    return dict(top_k=top_k, top_p=top_p, min_p=min_p)


def _chain_case(seed, V, probs, truncate):
    g = torch.Generator().manual_seed(seed)
    logits, qsl, drafts, q, temperature, seeds, _ = _random_batch(g, 13, 4, V, torch.float32, torch.int32, probs)
    kw = dict(temperature=temperature, seeds=seeds, **(_truncation(g, 13) if truncate else {}))
    return (logits, qsl, drafts), dict(draft_probs=q, offset=seed * 31), kw


def _same(a, b):
    assert len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b))


def _split(kw, in_params):
    """(SamplingParams of the fields in in_params, the other fields as keywords)."""
    return (av.SamplingParams(**{k: v for k, v in kw.items() if k in in_params}),
            {k: v for k, v in kw.items() if k not in in_params})


# every field from params; two from params and the rest as keywords; none from params (an empty object)
SPLITS = [FIELDS, ("temperature", "top_p"), ()]


# ---------------------------------------------------------------------------------------------------------------
# params == keywords
# ---------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("V", [7, 1000])
@pytest.mark.parametrize("probs", [None, "full"])
@pytest.mark.parametrize("truncate", [False, True])
@pytest.mark.parametrize("in_params", SPLITS)
def test_rejection_sample_params_match_keywords(V, probs, truncate, in_params):
    args, common, kw = _chain_case(V + 3 * truncate, V, probs, truncate)
    params, rest = _split(kw, in_params)
    for logprobs in (False, True):
        want = av.rejection_sample(*args, **common, **kw, logprobs=logprobs)
        _same(av.rejection_sample(*args, **common, params=params, **rest, logprobs=logprobs), want)


@pytest.mark.parametrize("kind", ["greedy", "sampled", "trunc"])
@pytest.mark.parametrize("in_params", SPLITS)
def test_tree_rejection_sample_params_match_keywords(kind, in_params):
    step = planned_step(4, R=9, N=12, V=200)
    kw = settings(step["R"], 4, kind)
    offset = kw.pop("offset")
    params, rest = _split(kw, in_params)
    args = (step["logits"], step["qsl"], step["parent"], step["ids"], step["W"])
    for logprobs in (False, True):
        want = av.tree_rejection_sample(*args, offset=offset, **kw, logprobs=logprobs)
        _same(av.tree_rejection_sample(*args, offset=offset, params=params, **rest, logprobs=logprobs), want)


@pytest.mark.parametrize("V", [5, 3000])
@pytest.mark.parametrize("in_params", SPLITS)
def test_sample_params_match_keywords(V, in_params):
    g = torch.Generator().manual_seed(V)
    N = 17
    logits = torch.randn(N, V, generator=g) * 3
    temperature = torch.where(torch.rand(N, generator=g) < 0.25, 0.0, torch.rand(N, generator=g) * 2 + 0.1)
    kw = dict(temperature=temperature, seeds=torch.randint(-2**62, 2**62, (N,), generator=g), **_truncation(g, N))
    params, rest = _split(kw, in_params)
    for logprobs in (False, True):
        want = av.sample(logits, offset=9, **kw, logprobs=logprobs)
        got = av.sample(logits, offset=9, params=params, **rest, logprobs=logprobs)
        _same(got, want) if logprobs else _same((got,), (want,))


def test_one_params_object_across_steps_follows_in_place_updates():
    """An engine's loop: one SamplingParams around persistent buffers, out= buffers, new values written in place
    each step (temperature, top_k, the logits): each step's tokens are the keywords' on fresh tensors."""
    args, common, kw = _chain_case(11, 64, None, True)
    logits = args[0]
    buffers = {k: v.clone() for k, v in kw.items()}
    params = av.SamplingParams(**buffers)
    R, K = args[2].shape
    out = (torch.empty(R, K + 1, dtype=torch.int32), torch.empty(R, dtype=torch.int32))
    g = torch.Generator().manual_seed(0)
    for step in range(4):
        got = av.rejection_sample(*args, draft_probs=None, offset=step, params=params, out=out)
        want = av.rejection_sample(*args, offset=step, **{k: v.clone() for k, v in buffers.items()})
        _same(got, want)
        buffers["temperature"].copy_(torch.rand(R, generator=g) * 2)
        buffers["top_k"].copy_(torch.randint(0, 5, (R,), generator=g))
        logits.mul_(-1)


# ---------------------------------------------------------------------------------------------------------------
# argument errors
# ---------------------------------------------------------------------------------------------------------------

def _ops(R=3, V=10):
    """(name, call(**kw)) of the three ops on a small valid batch of R requests."""
    logits = torch.randn(2 * R, V)
    qsl = torch.arange(0, 2 * R + 1, 2, dtype=torch.int32)
    drafts = torch.zeros(R, 1, dtype=torch.int32)
    parent = torch.tensor([-1, 0] * R, dtype=torch.int32)
    ids = torch.zeros(2 * R, dtype=torch.int32)
    return [("rejection_sample", lambda **kw: av.rejection_sample(logits, qsl, drafts, **kw)),
            ("tree_rejection_sample", lambda **kw: av.tree_rejection_sample(logits, qsl, parent, ids, 2, **kw)),
            ("sample", lambda **kw: av.sample(logits[:R], **kw))]


def _valid(R=3):
    return dict(temperature=torch.ones(R), top_k=torch.full((R,), 2, dtype=torch.int32), top_p=torch.full((R,), 0.9),
                min_p=torch.full((R,), 0.05), seeds=torch.arange(R, dtype=torch.int64))


@pytest.mark.parametrize("field", FIELDS)
def test_a_field_given_both_ways_names_both(field):
    values = _valid()
    params = av.SamplingParams(**{field: values[field]})
    for op, call in _ops():
        call(params=params)  # valid alone
        with pytest.raises(ValueError, match=rf"{field}= and params\.{field} are both given"):
            call(params=params, **{field: values[field]})


def test_every_conflicting_field_is_named():
    values = _valid()
    params = av.SamplingParams(**values)
    for op, call in _ops():
        with pytest.raises(ValueError) as e:
            call(params=params, top_p=values["top_p"], seeds=values["seeds"])
        assert "top_p= and params.top_p" in str(e.value) and "seeds= and params.seeds" in str(e.value), op


@pytest.mark.parametrize("field", FIELDS)
@pytest.mark.parametrize("value", [[1.0, 1.0, 1.0], 1.0, 2, "x"])
def test_a_field_of_the_wrong_type_is_named_at_construction(field, value):
    with pytest.raises(TypeError, match=rf"SamplingParams\.{field} must be a torch\.Tensor or None, got "
                                        rf"{type(value).__name__}"):
        av.SamplingParams(**{field: value})
    params = av.SamplingParams(**_valid())
    with pytest.raises(TypeError, match=rf"SamplingParams\.{field}"):
        dataclasses.replace(params, **{field: value})


def test_params_of_another_type_is_refused():
    for op, call in _ops():
        for bad in (dict(_valid()), "greedy", 1):
            with pytest.raises(TypeError, match=r"params must be an adaptive_verify\.SamplingParams, got "
                                                rf"{type(bad).__name__}"):
                call(params=bad)


@pytest.mark.parametrize("field, value, exc", [
    ("temperature", torch.ones(3, dtype=torch.float64), TypeError),
    ("top_k", torch.ones(3, dtype=torch.float32), TypeError),
    ("top_p", torch.full((4,), 0.5), ValueError),
    ("min_p", torch.full((3,), 1.5), ValueError),
    ("seeds", torch.arange(3, dtype=torch.int32), TypeError),
])
def test_ops_check_params_fields_as_they_check_keywords(field, value, exc):
    """Dtypes, shapes and values are the ops' to check, on every call: the error names the field by its name."""
    for op, call in _ops():
        with pytest.raises(exc, match=field):
            call(params=av.SamplingParams(**{**_valid(), field: value}))
        with pytest.raises(exc, match=field):
            call(**{**_valid(), field: value})


# ---------------------------------------------------------------------------------------------------------------
# torch.compile: params is unpacked before the registered custom ops
# ---------------------------------------------------------------------------------------------------------------

def test_params_compile_fullgraph_like_eager():
    dynamo = pytest.importorskip("torch._dynamo")
    args, common, kw = _chain_case(5, 50, None, True)
    chain_params = av.SamplingParams(**kw)
    step = planned_step(6, R=5, N=8, V=64)
    tree_kw = settings(step["R"], 6, "trunc")
    tree_offset = tree_kw.pop("offset")
    tree_params = av.SamplingParams(**tree_kw)
    N = args[0].shape[0]
    sample_params = av.SamplingParams(temperature=torch.ones(N), seeds=torch.arange(N), top_k=torch.full((N,), 3))

    def fn(chain_logits, tree_logits, chain_params, tree_params):
        chain = av.rejection_sample(chain_logits, *args[1:], offset=7, params=chain_params, logprobs=True)
        tree = av.tree_rejection_sample(tree_logits, step["qsl"], step["parent"], step["ids"], step["W"],
                                        offset=tree_offset, params=tree_params)
        first = av.sample(chain_logits, offset=3, params=sample_params)
        return (*chain, *tree, first)

    inputs = (args[0], step["logits"], chain_params, tree_params)
    dynamo.reset()
    eager = fn(*inputs)
    _same(eager[:3], av.rejection_sample(*args, offset=7, **kw, logprobs=True))
    _same(eager[3:6], av.tree_rejection_sample(step["logits"], step["qsl"], step["parent"], step["ids"], step["W"],
                                               offset=tree_offset, **tree_kw))
    _same(torch.compile(fn, fullgraph=True)(*inputs), eager)
    explained = dynamo.explain(fn)(*inputs)
    ops = " ".join(str(n.target) for gm in explained.graphs for n in gm.graph.nodes if n.op == "call_function")
    for name in ("rejection_sample_into", "tree_rejection_sample_into", "sample_into"):
        assert name in ops, f"{name} is not in the compiled graph"
