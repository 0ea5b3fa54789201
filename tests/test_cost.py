"""Tests for adaptive_verify.cost: hand-computed costs on small tables, errors, dense arrays, JSON, profiler."""

import json
import math
import time

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from adaptive_verify import cost

CostTable = cost.CostTable


def staircase_table(**kwargs):
    # graph sizes 8/16/32 measured exactly; eager points at 64 and 128.
    return CostTable.from_points(
        {8: 1.0, 16: 2.0, 32: 4.0, 64: 10.0, 128: 16.0}, graph_sizes=[8, 16, 32], max_tokens=256, **kwargs
    )


# ----------------------------------------------------------------------------------------------------------
# verify curve
# ----------------------------------------------------------------------------------------------------------


def test_envelope_removes_dip():
    t = CostTable.from_points({10: 1.0, 20: 3.0, 30: 2.0, 40: 5.0})
    # envelope: 1, 3, 3, 5
    assert t.verify_cost(30) == 3.0
    assert t.verify_cost(25) == 3.0  # not 2.5: the dip at 30 is gone
    assert t.verify_cost(35) == 4.0
    assert t.verify_cost(15) == 2.0
    assert t.verify_ms == {10: 1.0, 20: 3.0, 30: 2.0, 40: 5.0}  # the raw points are kept as measured


def test_no_graph_sizes_interpolates_and_extrapolates():
    t = CostTable.from_points({2: 1.0, 4: 3.0})
    assert [t.verify_cost(n) for n in range(7)] == [1.0, 1.0, 1.0, 2.0, 3.0, 4.0, 5.0]
    assert CostTable.from_points({4: 2.5}).verify_cost(1000) == 2.5  # one point: flat both ways


def test_staircase_cliff_and_extrapolation():
    t = staircase_table()
    expected = {
        0: 1.0, 1: 1.0, 8: 1.0,  # padded up to graph size 8
        9: 2.0, 16: 2.0,
        17: 4.0, 32: 4.0,
        33: 10.0, 48: 10.0, 63: 10.0,  # past the cliff: first eager point, no interpolation from 32
        64: 10.0, 96: 13.0, 128: 16.0,
        192: 22.0, 256: 28.0,  # slope of the last two eager points: 6 ms / 64 tokens
    }
    assert {n: t.verify_cost(n) for n in expected} == expected


def test_graph_size_between_points_is_interpolated():
    t = CostTable.from_points({8: 1.0, 16: 2.0, 32: 4.0, 64: 10.0}, graph_sizes=[8, 16, 24, 32])
    assert t.verify_cost(17) == t.verify_cost(24) == 3.0


def test_graph_size_past_last_graph_point_is_extrapolated():
    # graph-region points 8 and 16 (slope 2/8); graph size 32 = 3 + 2 * 16 / 8 = 7
    t = CostTable.from_points({8: 1.0, 16: 3.0, 100: 20.0}, graph_sizes=[8, 16, 32])
    assert [t.verify_cost(n) for n in (16, 17, 32, 33, 100)] == [3.0, 7.0, 7.0, 20.0, 20.0]
    # one graph-region point: flat
    t = CostTable.from_points({8: 2.0, 64: 5.0}, graph_sizes=[8, 16])
    assert [t.verify_cost(n) for n in (9, 16, 17)] == [2.0, 2.0, 5.0]


def test_no_point_in_graph_region_uses_first_point():
    t = CostTable.from_points({16: 3.0, 32: 5.0}, graph_sizes=[4, 8])
    assert [t.verify_cost(n) for n in (0, 4, 8, 12, 16, 24, 48)] == [3.0, 3.0, 3.0, 3.0, 3.0, 4.0, 7.0]


def test_no_eager_point_extrapolates_graph_region():
    t = CostTable.from_points({8: 1.0, 16: 2.0, 32: 4.0}, graph_sizes=[8, 16, 32])
    assert [t.verify_cost(n) for n in (32, 33, 48)] == [4.0, 4.125, 6.0]


def test_running_max_across_cliff():
    # graph size 32 extrapolates to 7.0, above the first eager point (5.0): the result must not dip.
    t = CostTable.from_points({8: 1.0, 16: 3.0, 40: 5.0, 80: 9.0}, graph_sizes=[8, 16, 32])
    assert [t.verify_cost(n) for n in (32, 33, 40, 60, 70, 80)] == [7.0, 7.0, 7.0, 7.0, 8.0, 9.0]


def test_n_above_max_tokens_raises():
    t = staircase_table()
    with pytest.raises(ValueError, match=r"^n=257 exceeds max_tokens=256"):
        t.verify_cost(257)
    with pytest.raises(ValueError, match=r"^n=257"):
        t.step_cost(1, 257)


# ----------------------------------------------------------------------------------------------------------
# draft curve and step cost
# ----------------------------------------------------------------------------------------------------------


def test_draft_dict_envelope_and_extrapolation():
    t = CostTable.from_points({1: 1.0}, draft_ms={1: 0.5, 5: 1.5, 9: 1.0}, draft_interpolation="linear")
    # envelope 0.5, 1.5, 1.5: flat below, linear between, extrapolation of a flat tail stays flat
    assert [t.draft_cost(r) for r in (0, 1, 3, 5, 7, 9, 13)] == [0.5, 0.5, 1.0, 1.5, 1.5, 1.5, 1.5]
    t = CostTable.from_points({1: 1.0}, draft_ms={1: 0.5, 5: 1.5}, draft_interpolation="linear")
    assert t.draft_cost(9) == 2.5


def test_draft_staircase_is_the_default_as_for_padded_drafter_graphs():
    """r requests cost the next measured count >= r (a drafter graph padded up), vLLM's pricing; linear
    extrapolation from the last two points above the last."""
    t = CostTable.from_points({1: 1.0}, draft_ms={1: 0.5, 4: 1.0, 8: 2.0})
    assert t.draft_interpolation == "staircase"
    assert [t.draft_cost(r) for r in (0, 1, 2, 4, 5, 8, 12)] == [0.5, 0.5, 1.0, 1.0, 2.0, 2.0, 3.0]
    assert torch.equal(t.draft_array(12), torch.tensor([t.draft_cost(r) for r in range(13)], dtype=torch.float32))
    # envelope first: a dip at 8 is lifted to the running max
    t = CostTable.from_points({1: 1.0}, draft_ms={1: 0.5, 4: 1.0, 8: 0.7})
    assert [t.draft_cost(r) for r in (5, 8, 9)] == [1.0, 1.0, 1.0]
    with pytest.raises(ValueError, match="^draft_interpolation"):
        CostTable.from_points({1: 1.0}, draft_ms={1: 0.5}, draft_interpolation="cubic")


def test_single_eager_point_extrapolates_across_the_cliff():
    """Found against vLLM's builder: one measured point above the largest graph size used to extrapolate
    flat, so every token past it looked free. The tail now runs through the last two measured points."""
    t = CostTable.from_points({8: 1.0, 64: 3.0, 100: 12.0}, graph_sizes=[8, 16, 32, 64])
    slope = (12.0 - 3.0) / (100 - 64)
    assert t.verify_cost(100) == 12.0
    assert t.verify_cost(200) == pytest.approx(12.0 + slope * 100)
    assert t.verify_cost(101) > t.verify_cost(100)
    # two eager points: their own slope, as before
    t2 = CostTable.from_points({8: 1.0, 64: 3.0, 100: 12.0, 200: 14.0}, graph_sizes=[8, 16, 32, 64])
    assert t2.verify_cost(300) == pytest.approx(16.0)
    # flat only when the data is: a single point in all
    assert CostTable.from_points({100: 5.0}, graph_sizes=[8]).verify_cost(10**6) == 5.0
    flat = CostTable.from_points({8: 5.0, 100: 5.0}, graph_sizes=[8])
    assert flat.verify_cost(10**6) == 5.0


def test_request_ms_is_a_per_request_fixed_term():
    """fixed_cost(r) = draft_cost(r) + request_ms * r, inside step_cost; kept by shifted views, JSON and the
    roofline; tables without it (and files before format_version 3) have none."""
    t = CostTable.from_points({1: 1.0, 3: 2.0}, draft_ms={2: 0.5, 4: 1.5}, request_ms=0.25)
    assert t.request_ms == 0.25
    assert [t.fixed_cost(r) for r in (0, 1, 3, 8)] == [0.5, 0.75, 1.5 + 0.75, 3.5 + 2.0]
    assert t.step_cost(3, 2) == 1.5 + 0.75 + 1.5
    assert t.shifted(1).request_ms == 0.25 and t.shifted(1).fixed_cost(3) == t.fixed_cost(3)
    assert CostTable.from_dict(t.to_dict()) == t and t.to_dict()["request_ms"] == 0.25
    assert "request_ms=0.25" in repr(t)
    plain = CostTable.from_points({1: 1.0}, draft_ms=0.5)
    assert plain.request_ms == 0.0 and plain.fixed_cost(100) == plain.draft_cost(100) == 0.5
    v2 = plain.to_dict()
    v2.update(format_version=2)
    del v2["request_ms"], v2["draft_levels"], v2["draft_level_ms"], v2["draft_catch_up"]
    assert CostTable.from_dict(v2).request_ms == 0.0
    roof = CostTable.roofline(hbm_gbps=1000.0, tflops=100.0, weight_bytes=1e9, active_params=1e9,
                              kv_bytes_per_token=0.0, context_len=0, max_tokens=64, request_ms=0.1)
    assert roof.fixed_cost(10) == pytest.approx(1.0)


def test_draft_constant_and_step_cost():
    t = staircase_table(draft_ms=0.25)
    assert t.draft_cost(0) == t.draft_cost(1000) == 0.25
    assert t.step_cost(4, 96) == 13.25
    t = CostTable.from_points({1: 1.0, 3: 2.0}, draft_ms={2: 0.5, 4: 1.5})
    assert t.step_cost(3, 2) == 1.5 + 1.5  # staircase: 3 requests cost what 4 cost
    assert isinstance(t.step_cost(3, 2), float)
    assert CostTable.from_points({1: 1.0}).draft_cost(7) == 0.0  # default: no drafter cost


# ----------------------------------------------------------------------------------------------------------
# dense arrays
# ----------------------------------------------------------------------------------------------------------


def test_verify_array_matches_scalar_as_float32_and_is_cached():
    # values that are not float32-exact, so the rounding is exercised
    t = CostTable.from_points({3: 0.1, 7: 0.3, 20: 0.7, 50: 1.1}, draft_ms={1: 0.01, 9: 0.23}, graph_sizes=[3, 7])
    a = t.verify_array(60)
    assert a.dtype == torch.float32 and a.device.type == "cpu" and a.shape == (61,)
    expected = torch.tensor([t.verify_cost(n) for n in range(61)], dtype=torch.float64).to(torch.float32)
    assert torch.equal(a, expected)
    assert t.verify_array(60) is a  # same max_n: same view object
    b = t.verify_array(10)
    assert b.shape == (11,) and b.data_ptr() == a.data_ptr()  # a slice of the cached tensor
    assert t.verify_array(60).data_ptr() == a.data_ptr()

    big = t.verify_array(5000)  # grows: new storage, same values where both are defined
    assert big.shape == (5001,)
    assert torch.equal(big[:61], expected)
    assert big[5000].item() == torch.tensor(t.verify_cost(5000), dtype=torch.float32).item()
    assert torch.equal(a, expected)  # the replaced tensor is still alive and unchanged

    d = t.draft_array(12)
    assert torch.equal(d, torch.tensor([t.draft_cost(r) for r in range(13)], dtype=torch.float64).to(torch.float32))
    assert t.draft_array(12) is d


def test_verify_array_clamped_to_max_tokens():
    t = staircase_table()
    a = t.verify_array(1000)
    assert a.shape == (257,)
    assert a[256].item() == 28.0


@pytest.mark.cuda
def test_dense_arrays_on_cuda_and_cuda_event_profile():
    t = CostTable.from_points({3: 0.1, 7: 0.3, 20: 0.7}, draft_ms={1: 0.01, 9: 0.23}, graph_sizes=[3, 7])
    a = t.verify_array(100, device="cuda")
    assert a.device.type == "cuda" and torch.equal(a.cpu(), t.verify_array(100))
    assert t.verify_array(100, device=torch.device("cuda", torch.cuda.current_device())) is a  # "cuda" == "cuda:i"
    assert torch.equal(t.draft_array(5, device="cuda").cpu(), t.draft_array(5))

    x = torch.randn(256, 256, device="cuda")
    p = CostTable.profile(lambda n: x[:n] @ x, [16, 256], reps=3, warmup=1, device="cuda")
    assert all(ms > 0 for ms in p.verify_ms.values())
    assert p.metadata["measured"].endswith("cuda events")
    assert p.metadata["device"] == torch.cuda.get_device_name()


# ----------------------------------------------------------------------------------------------------------
# JSON
# ----------------------------------------------------------------------------------------------------------


def test_json_round_trip(tmp_path):
    meta = {
        "device": "NVIDIA H200",
        "model": "deepseek-v4-flash",
        "dtype": "bfloat16",
        "date": "2026-05-01T12:00:00+00:00",
        "measured": "median of 5 reps after 2 warmup, cuda events",
        "notes": {"tp": 8, "ep": [1, 2], "unicode": "µs"},
    }
    t = CostTable.from_points(
        {1: 0.1 + 0.2, 8: 1 / 3, 64: 2.0000000000000004, 100: 7.0},
        draft_ms={1: 0.05, 16: math.pi},
        graph_sizes=[1, 2, 4, 8, 64],
        max_tokens=4096,
        metadata=meta,
    )
    path = tmp_path / "cost.json"
    t.to_json(path)
    assert json.loads(path.read_text())["format_version"] == cost.FORMAT_VERSION == 4
    u = CostTable.from_json(path)
    assert u == t and u.draft_interpolation == "staircase"
    assert u.verify_ms == t.verify_ms and u.draft_ms == t.draft_ms
    assert u.graph_sizes == (1, 2, 4, 8, 64) and u.max_tokens == 4096
    assert dict(u.metadata) == meta
    assert [u.verify_cost(n) for n in range(0, 4097, 37)] == [t.verify_cost(n) for n in range(0, 4097, 37)]

    t = CostTable.from_points({3: 1.5}, draft_ms=0.125)  # constant drafter, unbounded, no graphs
    t.to_json(path)
    u = CostTable.from_json(path)
    assert u == t and u.draft_ms == 0.125 and u.max_tokens is None and u.graph_sizes == ()


def test_json_version_1_files_keep_their_linear_drafter(tmp_path):
    """Files written before the drafter staircase (format_version 1) read back with the semantics they were
    written under."""
    path = tmp_path / "v1.json"
    path.write_text(json.dumps({"format_version": 1, "verify_ms": [[1, 2.0], [64, 4.0]],
                                "draft_ms": [[1, 1.0], [9, 2.0]], "graph_sizes": [], "max_tokens": None,
                                "metadata": {}}))
    t = CostTable.from_json(path)
    assert t.draft_interpolation == "linear" and t.draft_cost(5) == 1.5


def test_json_deep_nesting_is_a_value_error(tmp_path):
    path = tmp_path / "deep.json"
    path.write_text("[" * 100000 + "]" * 100000)
    with pytest.raises(ValueError, match="deep.json"):
        CostTable.from_json(path)


@pytest.mark.parametrize(
    "edit, match",
    [
        (lambda d: d.update(format_version=5), "format_version=5 is not supported"),
        (lambda d: d.update(format_version=1),
         r"unknown keys \['draft_interpolation', 'request_ms', 'draft_levels', 'draft_level_ms', 'draft_catch_up'\] "
         r"in a format_version 1"),
        (lambda d: d.update(format_version=2),
         r"unknown keys \['request_ms', 'draft_levels', 'draft_level_ms', 'draft_catch_up'\] in a format_version 2"),
        (lambda d: d.update(format_version=3),
         r"unknown keys \['draft_levels', 'draft_level_ms', 'draft_catch_up'\] in a format_version 3"),
        (lambda d: d.update(request_ms=-0.5), "request_ms"),
        (lambda d: d.update(draft_interpolation="cubic"), "draft_interpolation"),
        (lambda d: d.pop("format_version"), "format_version missing"),
        (lambda d: d.update(graph_size=[8]), r"unknown keys \['graph_size'\]"),
        (lambda d: d.update(verify_ms=[[8, 1.0], [8, 2.0]]), "verify_ms: duplicate count 8"),
    ],
)
def test_json_rejects_bad_files(tmp_path, edit, match):
    data = staircase_table().to_dict()
    edit(data)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ValueError, match=match):
        CostTable.from_json(path)


# ----------------------------------------------------------------------------------------------------------
# argument errors: each names its argument first
# ----------------------------------------------------------------------------------------------------------

V = {1: 1.0}

BAD_FROM_POINTS = [
    (dict(verify_ms={}), ValueError, "verify_ms"),
    (dict(verify_ms={16: 1.0, 8: 0.5}), ValueError, "verify_ms"),
    (dict(verify_ms={0: 1.0}), ValueError, "verify_ms"),
    (dict(verify_ms={-4: 1.0}), ValueError, "verify_ms"),
    (dict(verify_ms={1: 0.0}), ValueError, "verify_ms"),
    (dict(verify_ms={1: -1.0}), ValueError, "verify_ms"),
    (dict(verify_ms={1: math.nan}), ValueError, "verify_ms"),
    (dict(verify_ms={1: math.inf}), ValueError, "verify_ms"),
    (dict(verify_ms={1.5: 1.0}), TypeError, "verify_ms"),
    (dict(verify_ms={True: 1.0}), TypeError, "verify_ms"),
    (dict(verify_ms={1: "1.0"}), TypeError, "verify_ms"),
    (dict(verify_ms=[(1, 1.0)]), TypeError, "verify_ms"),
    (dict(verify_ms=V, draft_ms={1: -0.1}), ValueError, "draft_ms"),
    (dict(verify_ms=V, draft_ms={1: math.nan}), ValueError, "draft_ms"),
    (dict(verify_ms=V, draft_ms={2: 0.1, 1: 0.2}), ValueError, "draft_ms"),
    (dict(verify_ms=V, draft_ms={0: 0.1}), ValueError, "draft_ms"),
    (dict(verify_ms=V, draft_ms={}), ValueError, "draft_ms"),
    (dict(verify_ms=V, draft_ms=-1.0), ValueError, "draft_ms"),
    (dict(verify_ms=V, draft_ms=math.inf), ValueError, "draft_ms"),
    (dict(verify_ms=V, draft_ms="0.5"), TypeError, "draft_ms"),
    (dict(verify_ms=V, graph_sizes=[0, 8]), ValueError, "graph_sizes"),
    (dict(verify_ms=V, graph_sizes=[8, 8]), ValueError, "graph_sizes"),
    (dict(verify_ms=V, graph_sizes=[16, 8]), ValueError, "graph_sizes"),
    (dict(verify_ms=V, graph_sizes=[8.0]), TypeError, "graph_sizes"),
    (dict(verify_ms=V, graph_sizes="8"), TypeError, "graph_sizes"),
    (dict(verify_ms=V, max_tokens=0), ValueError, "max_tokens"),
    (dict(verify_ms=V, graph_sizes=[8, 32], max_tokens=16), ValueError, "max_tokens"),
    (dict(verify_ms=V, max_tokens=1.5), TypeError, "max_tokens"),
    (dict(verify_ms=V, metadata=[("device", "x")]), TypeError, "metadata"),
    (dict(verify_ms=V, metadata={1: "x"}), TypeError, "metadata"),
    (dict(verify_ms=V, request_ms=-0.01), ValueError, "request_ms"),
    (dict(verify_ms=V, request_ms=math.nan), ValueError, "request_ms"),
    (dict(verify_ms=V, request_ms="0.1"), TypeError, "request_ms"),
    # issue 16: every cost a kernel reads as float32 stays finite there; sizes are bounded before any work
    (dict(verify_ms={1: 2e9}), ValueError, "verify_ms"),
    (dict(verify_ms={1: 10**400}), ValueError, "verify_ms"),  # not Python's OverflowError
    (dict(verify_ms=V, draft_ms=1e300), ValueError, "draft_ms"),
    (dict(verify_ms=V, request_ms=2e9), ValueError, "request_ms"),
    (dict(verify_ms=V, graph_sizes=range(1, 10**9)), ValueError, "graph_sizes"),  # bounded before it is walked
    (dict(verify_ms=V, metadata={"a": object()}), TypeError, "metadata"),
    (dict(verify_ms=V, draft_interpolation=np.array(["linear"])), ValueError, "draft_interpolation"),
    (dict(verify_ms=V, metadata={"a": math.nan}), ValueError, "metadata"),
    (dict(verify_ms=V, metadata=json.loads('{"a":' * 900 + "1" + "}" * 900)), ValueError, "metadata"),
]


@pytest.mark.parametrize("kwargs, exc, name", BAD_FROM_POINTS)
def test_from_points_errors_name_argument(kwargs, exc, name):
    with pytest.raises(exc, match=rf"^{name}\b"):
        CostTable.from_points(**kwargs)


@pytest.mark.parametrize(
    "call, exc, name",
    [
        (lambda t: t.verify_cost(-1), ValueError, "n"),
        (lambda t: t.verify_cost(1.0), TypeError, "n"),
        (lambda t: t.draft_cost(-1), ValueError, "r"),
        (lambda t: t.step_cost(-1, 4), ValueError, "r"),
        (lambda t: t.step_cost(1, -4), ValueError, "n"),
        (lambda t: t.fixed_cost(-1), ValueError, "r"),
        (lambda t: t.verify_array(-1), ValueError, "max_n"),
        (lambda t: t.draft_array(-1), ValueError, "max_r"),
        (lambda t: t.draft_array(2.0), TypeError, "max_r"),
        (lambda t: t.verify_cost(10**400), ValueError, "n"),  # issue 16: not Python's OverflowError
        (lambda t: t.draft_cost(2**70), ValueError, "r"),
        (lambda t: t.verify_array(4, "foo"), ValueError, "device"),  # not torch's RuntimeError
        (lambda t: t.verify_array(4, "meta"), ValueError, "device"),
        (lambda t: t.verify_array(4, 1.5), TypeError, "device"),
        (lambda t: t.shifted(2**70), ValueError, "tokens"),
        (lambda t: t.to_json(3), TypeError, "path"),
        (lambda t: CostTable.from_json(0), TypeError, "path"),  # an int is a file descriptor: stdin would block
    ],
)
def test_method_errors_name_argument(call, exc, name):
    with pytest.raises(exc, match=rf"^{name}\b"):
        call(staircase_table())


def _noop(_):
    pass


@pytest.mark.parametrize(
    "kwargs, exc, name",
    [
        (dict(step_fn=None), TypeError, "step_fn"),
        (dict(token_counts=[]), ValueError, "token_counts"),
        (dict(token_counts=[4, 2]), ValueError, "token_counts"),
        (dict(reps=0), ValueError, "reps"),
        (dict(warmup=-1), ValueError, "warmup"),
        (dict(draft_fn=_noop), ValueError, "request_counts"),
        (dict(request_counts=[1]), ValueError, "draft_fn"),
        (dict(draft_fn=_noop, request_counts=[0]), ValueError, "request_counts"),
        (dict(graph_sizes=[8, 4]), ValueError, "graph_sizes"),
        (dict(max_tokens=0), ValueError, "max_tokens"),
    ],
)
def test_profile_errors_name_argument(kwargs, exc, name):
    calls = []
    args = dict(step_fn=calls.append, token_counts=[1, 2], device="cpu") | kwargs
    with pytest.raises(exc, match=rf"^{name}\b"):
        CostTable.profile(**args)
    assert calls == []  # arguments are checked before anything is timed


ROOFLINE = dict(
    hbm_gbps=1000.0, tflops=1000.0, weight_bytes=1e10, active_params=5e9, kv_bytes_per_token=1000.0, context_len=1000
)


@pytest.mark.parametrize(
    "kwargs, exc, name",
    [
        (dict(hbm_gbps=0.0), ValueError, "hbm_gbps"),
        (dict(tflops=-1.0), ValueError, "tflops"),
        (dict(weight_bytes=math.nan), ValueError, "weight_bytes"),
        (dict(active_params=0), ValueError, "active_params"),
        (dict(kv_bytes_per_token=-1.0), ValueError, "kv_bytes_per_token"),
        (dict(context_len=-1), ValueError, "context_len"),
        (dict(context_len=10.5), TypeError, "context_len"),
        (dict(overhead_ms=-0.1), ValueError, "overhead_ms"),
        (dict(token_counts=[8, 8]), ValueError, "token_counts"),
        (dict(hbm_gbps="fast"), TypeError, "hbm_gbps"),
    ],
)
def test_roofline_errors_name_argument(kwargs, exc, name):
    with pytest.raises(exc, match=rf"^{name}\b"):
        CostTable.roofline(**(ROOFLINE | kwargs))


# ----------------------------------------------------------------------------------------------------------
# profiler
# ----------------------------------------------------------------------------------------------------------


def test_profile_takes_median_after_warmup(monkeypatch):
    now = [0]
    monkeypatch.setattr(time, "perf_counter_ns", lambda: now[0])
    # per count: two warmup durations (huge, must be ignored), then three timed ones; median = middle one
    verify_ns = {4: [10**9, 10**9, 3_000_000, 1_000_000, 2_000_000], 8: [10**9, 10**9, 2_500_000, 9_000_000, 4_000_000]}
    draft_ns = {1: [10**9, 10**9, 200_000, 100_000, 300_000], 2: [10**9, 10**9, 700_000, 500_000, 600_000]}
    calls = []

    def step(table):
        def fn(x):
            calls.append(x)
            now[0] += table[x].pop(0)

        return fn

    t = CostTable.profile(
        step(verify_ns), [4, 8], draft_fn=step(draft_ns), request_counts=[1, 2],
        graph_sizes=[4, 8], reps=3, warmup=2, max_tokens=64, metadata={"model": "toy"}, device="cpu",
    )
    assert calls == [4] * 5 + [8] * 5 + [1] * 5 + [2] * 5
    assert t.verify_ms == {4: 2.0, 8: 4.0}
    assert t.draft_ms == {1: 0.2, 2: 0.6}
    assert t.graph_sizes == (4, 8) and t.max_tokens == 64
    assert t.metadata["model"] == "toy" and t.metadata["source"] == "profile"
    assert t.metadata["measured"] == "median of 3 reps after 2 warmup, perf_counter_ns"
    assert t.metadata["device"].startswith("cpu")
    assert "drafter" not in t.metadata


def test_profile_real_clock_without_drafter():
    t = CostTable.profile(lambda n: sum(range(1000 * n)), [1, 4], reps=1, warmup=0, device="cpu")
    assert all(ms > 0 for ms in t.verify_ms.values())
    assert t.draft_ms == 0.0 and "draft cost 0" in t.metadata["drafter"]
    assert t.verify_cost(4) >= t.verify_cost(1) > 0
    assert "T" in t.metadata["date"]  # ISO 8601


# ----------------------------------------------------------------------------------------------------------
# roofline
# ----------------------------------------------------------------------------------------------------------


def test_roofline_memory_then_compute_bound():
    # memory: 10 ms of weights + 0.001 ms KV per token; compute: 0.01 ms per token; crossover ~1111 tokens
    t = CostTable.roofline(**ROOFLINE, overhead_ms=0.5)
    assert t.verify_cost(1) == pytest.approx(0.5 + 10.001)
    assert t.verify_cost(64) == pytest.approx(0.5 + 10.064)  # memory-bound: 64 tokens cost 0.6% more than 1
    assert t.verify_cost(4096) == pytest.approx(0.5 + 40.96)
    assert t.verify_cost(8192) == pytest.approx(0.5 + 81.92)  # compute-bound: linear in n
    assert t.metadata["source"] == "roofline" and t.metadata["roofline"]["tflops"] == 1000.0
    assert max(t.verify_ms) == 8192  # default token counts stop at 8192 when unbounded


def test_roofline_staircase_with_graph_sizes():
    t = CostTable.roofline(**ROOFLINE, graph_sizes=[1, 2, 4, 8, 16, 32], max_tokens=2048, draft_ms=0.25)
    assert t.verify_cost(3) == t.verify_cost(4) == pytest.approx(10.004)
    assert t.verify_cost(17) == t.verify_cost(32) > t.verify_cost(16)
    assert t.verify_cost(33) == pytest.approx(10.033)  # largest graph size + 1 is a default token count
    assert max(t.verify_ms) == 2048
    assert t.step_cost(2, 3) == 0.25 + t.verify_cost(3)


# ----------------------------------------------------------------------------------------------------------
# properties on random tables
# ----------------------------------------------------------------------------------------------------------


@st.composite
def tables(draw):
    keys = sorted(draw(st.sets(st.integers(1, 200), min_size=1, max_size=6)))
    values = draw(st.lists(st.floats(0.01, 50.0), min_size=len(keys), max_size=len(keys)))
    sizes = sorted(draw(st.sets(st.integers(1, 150), max_size=5)))
    return CostTable.from_points(dict(zip(keys, values)), graph_sizes=sizes)


@settings(max_examples=40, deadline=None)
@given(tables())
def test_monotone_positive_staircase(t):
    costs = [t.verify_cost(n) for n in range(301)]
    assert all(c > 0 for c in costs)
    assert all(a <= b for a, b in zip(costs, costs[1:]))
    for n in range(301):
        if t.graph_sizes and n <= t.graph_sizes[-1]:
            g = next(g for g in t.graph_sizes if g >= n)
            assert costs[n] == costs[g]
    assert torch.equal(t.verify_array(300), torch.tensor(costs, dtype=torch.float64).to(torch.float32))


@settings(max_examples=60, deadline=None)
@given(tables(), st.sampled_from(["staircase", "linear"]), st.integers(0, 40))
def test_dense_arrays_are_the_scalar_costs_bit_for_bit(t, draft_mode, shift):
    """The dense arrays are computed with numpy, operation for operation as the scalar path (issue 16: one Python
    call per count made the largest array take tens of seconds): every value equals the scalar cost exactly."""
    t = CostTable.from_points(t.verify_ms, {1: 0.5, 4: 0.5, 9: 2.0}, t.graph_sizes, draft_interpolation=draft_mode)
    view = t.shifted(shift) if shift else t
    for table in (t, view):
        want = torch.tensor([table.verify_cost(n) for n in range(400)], dtype=torch.float64)
        assert torch.equal(table.verify_array(399), want.to(torch.float32))
        assert torch.equal(torch.from_numpy(table.verify_curve.dense(400)), want)
    drafts = torch.tensor([t.draft_cost(r) for r in range(100)], dtype=torch.float64)
    assert torch.equal(t.draft_array(99), drafts.to(torch.float32))


def test_every_array_is_bounded_and_the_largest_is_fast():
    """Issue 16, finding 4: a huge token count (from extra_tokens, a shifted view or a file's max_tokens) built a
    Python list per count. Every table prices at most token_limit counts (max_tokens, else MAX_TOKENS_LIMIT less a
    shifted view's prompt tokens), checked before any work, and the largest array takes about a second."""
    limit = cost.MAX_TOKENS_LIMIT
    t = CostTable.from_points({1: 1.0, 64: 2.0, 5000: 30.0}, graph_sizes=[1, 2, 4, 8])
    assert t.token_limit == limit
    t0 = time.perf_counter()
    arr = t.verify_array(limit)
    assert time.perf_counter() - t0 < 20  # ~2 s on the 2-core CI machine; was a Python call per count
    for n in (0, 3, 64, 5000, 123457, limit):
        assert arr[n].item() == float(torch.tensor(t.verify_cost(n), dtype=torch.float32))
    view = t.shifted(limit - 100)
    assert view.token_limit == 100 and view.max_tokens is None
    assert view.verify_array(limit).shape == (101,)  # clamped to the counts a step can hold, as with max_tokens
    with pytest.raises(ValueError, match="^n="):
        view.verify_cost(101)
    with pytest.raises(ValueError, match="^tokens=16777216 leaves no room"):
        t.shifted(limit)
    with pytest.raises(ValueError, match="^max_tokens must be <= 16777216"):
        CostTable.from_points({1: 1.0}, max_tokens=limit + 1)


def test_json_with_a_huge_max_tokens_or_value_is_rejected_naming_the_file(tmp_path):
    for key, value, name in (("max_tokens", 2**70, "max_tokens"), ("max_tokens", cost.MAX_TOKENS_LIMIT * 8,
                                                                      "max_tokens"),
                             ("verify_ms", [[1, 1e999]], "verify_ms"), ("verify_ms", [[2**80, 1.0]], "verify_ms")):
        data = staircase_table().to_dict()
        data[key] = value
        path = tmp_path / "huge.json"
        path.write_text(json.dumps(data))
        with pytest.raises(ValueError, match=rf"huge.json: {name}"):
            CostTable.from_json(path)


def test_repr_is_short_and_useful():
    r = repr(staircase_table(metadata={"device": "NVIDIA H200"}))
    assert r.startswith("CostTable(") and "graph_sizes=[8, 16, 32]" in r and "max_tokens=256" in r
    assert "NVIDIA H200" in r and len(r) < 200


def test_shifted_is_the_curve_seen_from_the_prompt_tokens():
    ct = CostTable.from_points({1: 5.0, 64: 6.0, 512: 9.0, 4096: 40.0}, draft_ms={1: 0.5, 64: 1.0},
                                  graph_sizes=[8, 16, 32, 64], max_tokens=4096)
    assert ct.shifted(0) is ct
    s = ct.shifted(300)
    assert s is ct.shifted(300)  # cached
    assert s.max_tokens == 4096 - 300 and s.draft_ms == ct.draft_ms
    base = ct.verify_cost(300) - ct.verify_cost(0)
    for n in (0, 1, 7, 100, 255, 256, 257, 1000, 3000, 3796):
        assert s.verify_cost(n) == pytest.approx(ct.verify_cost(n + 300) - base, rel=1e-9, abs=1e-9), n
    # The staircase below the largest graph size is kept exactly where the shift lands inside it.
    g = ct.shifted(3)
    for n in range(0, 70):
        assert g.verify_cost(n) == pytest.approx(ct.verify_cost(n + 3) - (ct.verify_cost(3) - ct.verify_cost(0))), n
    with pytest.raises(ValueError, match="tokens=4096 leaves no room"):
        ct.shifted(4096)
    with pytest.raises(ValueError, match="tokens"):
        ct.shifted(-1)


def test_a_view_says_what_it_views():
    """shifted_by and unshifted: a view's prompt tokens and its table, so a caller prices the step's real time
    (unshifted.verify_cost(n + shifted_by)) without private fields; a table that is no view is its own."""
    ct = CostTable.from_points({1: 5.0, 64: 6.0, 512: 9.0}, graph_sizes=[8, 16], max_tokens=1024)
    assert ct.shifted_by == 0 and ct.unshifted is ct
    view = ct.shifted(100)
    assert view.shifted_by == 100 and view.unshifted is ct
    assert view.shifted(20).shifted_by == 120 and view.shifted(20).unshifted is ct  # a view of a view
    for n in (0, 5, 300, 924):
        step = view.verify_cost(n) + ct.verify_cost(100) - ct.verify_cost(0)
        assert step == pytest.approx(view.unshifted.verify_cost(n + view.shifted_by), abs=1e-9)
        assert view.verify_curve.cost(n) == view.verify_cost(n)
    with pytest.raises(AttributeError):
        view.shifted_by = 3  # read-only
    with pytest.raises(AttributeError):
        view.unshifted = ct


def test_shifted_is_exact_across_the_graph_eager_boundary():
    """A graph staircase up to 512 and an eager cliff right after: every shifted count is priced exactly."""
    ct = CostTable.from_points({1: 10.0, 512: 14.0, 513: 30.0, 4096: 60.0},
                              graph_sizes=[1, 2, 4] + list(range(8, 513, 8)), max_tokens=8192)
    for x in (7, 300, 3000):
        s = ct.shifted(x)
        base = ct.verify_cost(x) - ct.verify_cost(0)
        for n in range(1, min(4096, 8192 - x) + 1):
            assert s.verify_cost(n) == pytest.approx(ct.verify_cost(n + x) - base, abs=1e-9), (x, n)
        for n in (8192 - x, 8000 - x, 6000 - x):  # beyond 4096 above the shift: sampled at the breakpoints
            assert s.verify_cost(n) == pytest.approx(ct.verify_cost(n + x) - base, abs=1e-9), (x, n)


def test_shifted_without_max_tokens_extrapolates():
    ct = CostTable.from_points({1: 4.0, 64: 5.0}, draft_ms=0.5)
    s = ct.shifted(70)  # beyond the last measured point: the original extrapolates linearly, so does this
    assert s.max_tokens is None
    base = ct.verify_cost(70) - ct.verify_cost(0)
    for n in (1, 10, 26, 200):
        assert s.verify_cost(n) == pytest.approx(ct.verify_cost(n + 70) - base)


def test_shifted_is_o1_exact_and_bounded(monkeypatch):
    """An engine calls shifted() every step with a new prompt size: each call is O(1) (no resampling: the curve is
    never evaluated over counts to build a view), every count is exact, and the cache is bounded (issue: ~17 ms per
    new size, cached forever). O(1) is checked by counting curve evaluations, not by a clock (a timed test fails
    whenever a garbage collection of the whole suite's heap lands in it)."""
    from adaptive_verify.cost import curve as curve_mod
    from adaptive_verify.cost import table as table_mod

    ct = CostTable.from_points({1: 10.0, 512: 14.0, 513: 30.0, 4096: 60.0},
                               graph_sizes=[1, 2, 4] + list(range(8, 513, 8)), max_tokens=8192)
    ct.verify_array(8192)  # the base's dense values, built once
    evaluated = []
    for name in ("cost", "cost_many"):
        real = getattr(curve_mod.VerifyCurve, name)
        monkeypatch.setattr(curve_mod.VerifyCurve, name,
                            lambda self, n, _real=real: evaluated.append(1) or _real(self, n))
    views = [ct.shifted(x) for x in range(1, 2001)]
    assert not evaluated  # the shift's two costs are read from the base's dense values
    monkeypatch.undo()
    assert len(ct._shifted) <= table_mod.SHIFTED_CACHE_SIZE
    for x in (1, 300, 511, 512, 3000, 8191):
        s = ct.shifted(x)
        at_x, at_0 = ct.verify_cost(x), ct.verify_cost(0)
        for n in sorted({0, 1, 7, 100, max(511 - x, 0), 8192 - x}):
            if n > 8192 - x:
                continue
            assert s.verify_cost(n) == ct.verify_cost(n + x) - at_x + at_0, (x, n)  # the docstring's formula
        arr = s.verify_array(8192 - x)
        want = torch.tensor([ct.verify_cost(n + x) - at_x + at_0 for n in range(8192 - x + 1)], dtype=torch.float64)
        assert torch.equal(arr, want.to(torch.float32)), x
    assert views[0].shifted(5) is ct.shifted(6)  # a view of a view is a view of the base
    assert ct.shifted(100).graph_sizes[0] == 4 and ct.shifted(100).graph_sizes[-1] == 412


def test_shifted_views_in_a_captured_graph_are_kept(monkeypatch):
    """A view whose cost array was requested under CUDA-graph capture must outlive the LRU (the captured
    planner call reads it at every replay)."""
    from adaptive_verify.cost import table as table_mod

    ct = CostTable.from_points({1: 1.0, 64: 2.0}, max_tokens=4096)
    monkeypatch.setattr(table_mod, "_capturing", lambda dev: True)
    pinned = ct.shifted(7)
    arr = pinned.verify_array(100)
    monkeypatch.setattr(table_mod, "_capturing", lambda dev: False)
    for x in range(100, 100 + 2 * table_mod.SHIFTED_CACHE_SIZE):
        ct.shifted(x).verify_array(10)
    assert ct.shifted(7) is pinned and pinned.verify_array(100) is arr


def test_shifted_of_a_tiny_first_point_is_valid():
    """Found by fuzzing: {1: 1e-300, 2: 5, 10: 5} is a valid table, and so is its shifted view; and a view seen from
    past the jump still prices every count at >= base(0) > 0 (issue 16: base(n + x) - (base(x) - base(0)) rounded
    to a free step, 0.0; the documented order, base(n + x) - base(x) + base(0), cannot)."""
    ct = CostTable.from_points({1: 1e-300, 2: 5.0, 10: 5.0})
    s = ct.shifted(1)
    assert s.verify_cost(0) == 1e-300 and s.verify_cost(1) == 5.0 - 1e-300 + 1e-300
    far = ct.shifted(5)
    assert all(far.verify_cost(n) == 1e-300 for n in (0, 1, 5, 100))
    assert (far.verify_array(100).double() == torch.tensor(1e-300).float().double()).all()


def test_profile_points_cover_graph_sizes_and_an_eager_tail():
    pts = CostTable.profile_points([1, 2, 4, 8, 16, 32], 256)
    assert pts[:6] == [1, 2, 4, 8, 16, 32]
    tail = pts[6:]
    assert tail[0] == 33 and tail[-1] == 256 and len(tail) >= 2
    assert all(b <= max(a + 1, math.ceil(a * 1.5)) for a, b in zip(tail, tail[1:]))
    assert CostTable.profile_points([], 10) == [1, 2, 3, 5, 8, 10]
    with pytest.raises(ValueError, match="^max_tokens or graph_sizes"):
        CostTable.profile_points([], None)
    with pytest.raises(ValueError, match="^growth"):
        CostTable.profile_points([8], 64, growth=1.0)


def test_load_or_profile_reuses_matching_files_and_reprofiles_others(tmp_path):
    calls = []

    def step(n):
        calls.append(n)
        time.sleep(0.0002 * (1 + n / 64))

    path = tmp_path / "cost.json"
    kw = dict(graph_sizes=[8, 16], max_tokens=64, reps=1, warmup=0, device="cpu")
    t = CostTable.load_or_profile(path, step, expect={"model": "m1", "device": "cpu-test"}, **kw)
    assert path.exists() and calls == CostTable.profile_points([8, 16], 64)
    assert t.metadata["model"] == "m1" and t.metadata["device"] == "cpu-test"
    calls.clear()
    u = CostTable.load_or_profile(path, step, expect={"model": "m1", "device": "cpu-test"}, **kw)
    assert calls == [] and u == t  # cache hit: nothing measured
    CostTable.load_or_profile(path, step, expect={"model": "m2", "device": "cpu-test"}, **kw)
    assert calls  # model changed: reprofiled
    calls.clear()
    CostTable.load_or_profile(path, step, expect={"model": "m2", "device": "cpu-test"},
                              **(kw | dict(graph_sizes=[8, 16, 32])))
    assert calls  # graph sizes changed: reprofiled
    calls.clear()
    path.write_text("{not json")
    CostTable.load_or_profile(path, step, expect={"model": "m2"}, **kw)
    assert calls and CostTable.from_json(path).metadata["model"] == "m2"
    with pytest.raises(TypeError, match="^expect keys"):
        CostTable.load_or_profile(path, step, expect={1: 2}, **kw)


def test_roofline_context_len_is_bounded():
    """Found by the fuzzer (issue 16): a context length too large for a float raised OverflowError."""
    kw = dict(hbm_gbps=4800, tflops=990, weight_bytes=16e9, active_params=8e9, kv_bytes_per_token=131072)
    for bad in (10**400, 2**31):
        with pytest.raises(ValueError, match="^context_len"):
            CostTable.roofline(context_len=bad, **kw)
    assert CostTable.roofline(context_len=2**31 - 1, **kw).verify_cost(1) > 0


def test_a_subnormal_verify_cost_is_refused_naming_it():
    """Fuzz seed 35, CostTable:380/928 (2026-12-03): 1e-320 ms is > 0 but subnormal, and 1 / 1e-320 overflows, so the
    planner's ratio would be infinite; refused like 0. The smallest normal double stays accepted (and 1e-300:
    test_shifted_of_a_tiny_first_point_is_valid)."""
    with pytest.raises(ValueError, match="verify_ms"):
        CostTable.from_points(verify_ms={1: 1e-320})
    assert CostTable.from_points(verify_ms={1: 2.2250738585072014e-308}).verify_cost(1) > 0
