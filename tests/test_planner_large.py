"""Large and skewed planner problems: the CPU kernel's bucketed ordering (used above 256 candidates) and
its recursive split of crowded buckets must still give the reference's integers exactly."""
import warnings

import pytest
import torch

import adaptive_verify as av
from adaptive_verify import reference as ref

CASES = [  # (R, K, how the confidences are skewed)
    (1024, 16, "pow"),  # survivals pile up near 0 at late positions: crowded low buckets
    (700, 16, "ones"),  # 30% exact 1.0 confidences: survival exactly 1.0 (fixed point 2^32) ties
    (300, 32, "pow"),
    (2000, 8, "eighths"),  # confidences on a 1/8 grid: massive exact ties, broken by position then request
    (64, 32, "ones"),
    (4096, 4, "tiny"),  # every survival below 1e-3: all in the lowest top-level bucket
    (600, 4, "near_one"),  # exact 1.0 next to 1 - 2^-24 ... 1 - 2^-10: one crowded top bucket
]


def _conf(R, K, how, g):
    conf = torch.rand(R, K, generator=g)
    if how == "pow":
        return conf ** 0.3
    if how == "ones":
        conf = conf ** 0.3
        conf[torch.rand(R, K, generator=g) < 0.3] = 1.0
        return conf
    if how == "eighths":
        return (conf * 8).round() / 8
    if how == "near_one":
        ulps = torch.randint(0, 2**14, (R, K), generator=g).float()
        conf = 1.0 - ulps * 2.0**-24
        conf[torch.rand(R, K, generator=g) < 0.4] = 1.0
        return conf
    return conf * 1e-3


@pytest.mark.parametrize("R,K,how", CASES)
def test_large_skewed_problems_match_reference(R, K, how):
    g = torch.Generator().manual_seed(R * 31 + K)
    ct = av.CostTable.from_points({1: 5.0, 64: 5.5, 256: 7.0, 1024: 15.0, 4096: 50.0, 32768: 300.0}, draft_ms=1.0,
                                  graph_sizes=[8, 16, 32, 64, 128, 256, 512])
    drafts = torch.randint(0, K + 1, (R,), generator=g, dtype=torch.int32)
    survival = av.prefix_survival(_conf(R, K, how, g), drafts)
    # Small fixed budgets put the threshold inside the crowded top buckets, where the order matters.
    runs = [("global", None), ("greedy", None), ("all", None)] + [("fixed", b) for b in (1, 5, 37, R * K // 3)]
    for min_verify in (0, 1):
        for mode, budget in runs:
            kw = dict(mode=mode, min_verify=min_verify, **({"budget": budget} if mode == "fixed" else {}))
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # global warns that it is not lossless live
                got = av.plan_verification(survival, drafts, ct, **kw)
            want = ref.plan_verification(survival, drafts, ct, **kw)
            for f in ("verify_lens", "budget", "expected_tokens", "num_tokens", "query_start_loc", "token_req"):
                assert torch.equal(getattr(got, f), getattr(want, f)), f"{how} R={R} K={K} {kw}: {f} differs"
