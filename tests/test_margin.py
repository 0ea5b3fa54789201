"""MarginEstimator: exact fallback before warm-up, per-position logistic fit on synthetic data, trial rules."""
import pytest
import torch

import adaptive_verify as av
from adaptive_verify.calibration import auc
from adaptive_verify.margin import MarginEstimator

# True model: P(draft j accepted | drafts < j accepted) = sigmoid(A[j] + B[j] * margin).
A = torch.tensor([-2.0, -1.5, -3.0], dtype=torch.float64)
B = torch.tensor([1.0, 0.8, 1.2], dtype=torch.float64)
K = 3


class Drafter:
    def __init__(self, seed):
        self.g = torch.Generator().manual_seed(seed)

    def step(self, R=64):
        """margin [R, K] float32, true probability [R, K], verify_lens [R], num_accepted [R], per-draft pass [R, K]."""
        margin = torch.rand(R, K, generator=self.g, dtype=torch.float64) * 6
        p = torch.sigmoid(A + B * margin)
        passes = torch.rand(R, K, generator=self.g, dtype=torch.float64) < p
        verify_lens = torch.randint(1, K + 1, (R,), generator=self.g, dtype=torch.int32)
        ok = passes & (torch.arange(K)[None, :] < verify_lens[:, None])
        num_accepted = torch.cumprod(ok.int(), 1).sum(1).int()
        return margin.float(), p, verify_lens, num_accepted, passes


def test_ones_until_each_position_has_data():
    est, drafter = MarginEstimator(K, refit_every=10, min_samples=200), Drafter(0)
    for _ in range(9):
        margin, _, L, acc, _ = drafter.step()
        assert torch.equal(est.predict(margin), torch.ones(64, K))  # exactly 1: verify everything
        assert est.observe(margin, L, acc) is False
    margin, _, L, acc, _ = drafter.step()
    assert est.observe(margin, L, acc) is True
    # 640 rows: position 0 has its 200 trials, position 2 (verified and reached far less often) does not.
    assert est.samples[0] >= 200 and est.samples[2] < 200
    conf = est.predict(drafter.step()[0])
    assert bool((conf[:, 0] < 1).all())
    assert torch.equal(conf[:, 2], torch.ones(64))


@pytest.fixture(scope="module")
def trained():
    est, drafter = MarginEstimator(K, refit_every=10, min_samples=200), Drafter(1)
    for _ in range(150):
        margin, _, L, acc, _ = drafter.step()
        est.observe(margin, L, acc)
    assert est.refits == 15 and min(est.samples) >= 200
    return est, drafter


def test_learns_per_position_acceptance(trained):
    est, drafter = trained
    grid = torch.linspace(0, 6, 61)[:, None].expand(61, K).contiguous()
    truth = torch.sigmoid(A + B * grid.double())
    err = (est.predict(grid).double() - truth).abs()
    assert float(err.max()) < 0.06, err.max(0)
    margin, p, _, _, passes = drafter.step(R=20000)
    conf = est.predict(margin)
    assert conf.dtype == torch.float32 and conf.shape == (20000, K)
    for j in range(K):
        got, best = auc(conf[:, j], passes[:, j]), auc(p[:, j], passes[:, j])
        assert got > 0.75 and got == pytest.approx(best, abs=0.01), (j, got, best)


def test_output_feeds_prefix_survival(trained):
    est, drafter = trained
    margin = drafter.step(R=33)[0]
    conf = est.predict(margin)
    drafts = torch.randint(0, K + 1, (33,), generator=torch.Generator().manual_seed(5), dtype=torch.int32)
    survival = av.prefix_survival(conf, drafts)
    want = torch.cumprod(conf.double(), 1) * (torch.arange(K)[None, :] < drafts[:, None])
    torch.testing.assert_close(survival.double(), want, rtol=1e-6, atol=0)


def test_margin_cap_and_narrow_blocks(trained):
    est, _ = trained
    conf = est.predict(torch.tensor([[float("inf"), 30.0], [1e9, 100.0]]))  # K' = 2 < K, capped margins
    assert bool(torch.isfinite(conf).all())
    assert conf[0, 0] == conf[1, 0] and conf[0, 1] == conf[1, 1]


def test_draft_margin_output_is_the_estimators_feature():
    """The op computes the feature, the model takes the tensor: draft_margin's [R, K] float32 output (+inf for a
    one-token vocabulary) goes straight into observe and predict."""
    g = torch.Generator().manual_seed(2)
    logits = torch.cat([torch.randn(5, K, 11, generator=g), torch.randn(5, K, 11, generator=g) * 8])
    margin = av.draft_margin(logits)
    top = torch.topk(logits, 2, dim=-1).values
    torch.testing.assert_close(margin, top[..., 0] - top[..., 1], rtol=0, atol=0)
    est = MarginEstimator(K, refit_every=1, min_samples=1)
    wide = margin[:, 0] > float(margin[:, 0].median())  # the request's first draft accepted iff its margin is wide
    est.observe(margin, torch.full((10,), K, dtype=torch.int32), wide.int())
    conf = est.predict(margin)
    assert conf.dtype == torch.float32 and tuple(conf.shape) == (10, K)
    assert float(conf[wide, 0].min()) > float(conf[~wide, 0].max())  # a wider margin, a higher confidence
    one_token = av.draft_margin(torch.randn(2, K, 1))
    assert torch.equal(one_token, torch.full((2, K), float("inf")))
    assert bool(torch.isfinite(est.predict(one_token)).all())  # capped at max_margin


def test_trial_definition_hand_case():
    est = MarginEstimator(K, refit_every=1, min_samples=1)
    margin = torch.ones(4, K)
    # row 0: 2 verified, both accepted -> trials at 0, 1 (accepted); position 2 not verified
    # row 1: 3 verified, 1 accepted   -> trials at 0 (accepted), 1 (rejected); position 2 never reached
    # row 2: nothing verified         -> no trials
    # row 3: 1 verified, 0 accepted   -> trial at 0 (rejected)
    L = torch.tensor([2, 3, 0, 1], dtype=torch.int32)
    acc = torch.tensor([2, 1, 0, 0], dtype=torch.int32)
    est.observe(margin, L, acc)
    assert est.samples == [3, 2, 0]
    assert est.fitted.tolist() == [True, True, False]
    conf = est.predict(margin)[0]
    # With one margin value the model is a regularised rate: 2/3 accepted at 0, 1/2 at 1.
    assert float(conf[0]) == pytest.approx(2 / 3, abs=0.01)
    assert float(conf[1]) == pytest.approx(1 / 2, abs=0.01)
    assert float(conf[2]) == 1.0


def test_buffer_keeps_latest_rows():
    est = MarginEstimator(1, refit_every=1, min_samples=1, buffer_rows=100)
    ones = torch.ones(70, 1)
    L = torch.ones(70, dtype=torch.int32)
    est.observe(ones, L, torch.zeros(70, dtype=torch.int32))  # 70 rejections
    est.observe(ones, L, torch.ones(70, dtype=torch.int32))  # 70 accepts, 40 rejections dropped
    assert est.samples == [100]
    assert float(est.predict(ones)[0, 0]) == pytest.approx(0.7, abs=0.01)
    est.observe(torch.ones(250, 1), torch.ones(250, dtype=torch.int32), torch.ones(250, dtype=torch.int32))
    assert est.samples == [100] and float(est.predict(ones)[0, 0]) > 0.98


def test_bad_inputs_name_argument():
    est = MarginEstimator(K)
    L = torch.ones(4, dtype=torch.int32)
    with pytest.raises(ValueError, match="margin"):
        est.predict(torch.ones(4, K + 1))
    with pytest.raises(TypeError, match="margin"):
        est.predict(torch.ones(4, K, dtype=torch.int32))
    with pytest.raises(ValueError, match="margin"):
        est.predict(torch.ones(4))
    with pytest.raises(TypeError, match="verify_lens"):
        est.observe(torch.ones(4, K), L.float(), L)
    with pytest.raises(ValueError, match="num_accepted"):
        est.observe(torch.ones(4, K), L, L[:3])
    for kwargs, name in (
        ({"l2": 0.0}, "l2"),
        ({"min_samples": 0}, "min_samples"),
        ({"max_margin": float("inf")}, "max_margin"),
        ({"refit_every": 0}, "refit_every"),
        ({"max_margin": 1e39}, "max_margin"),
        ({"l2": 10**400}, "l2"),  # not Python's OverflowError  # issue 16: finite in float64, inf as the float32 margins' bound
        ({"buffer_rows": 2**40}, "buffer_rows"),  # a bound on the ring buffer's allocation
        ({"device": "foo"}, "device"),
    ):
        with pytest.raises(ValueError, match=name):
            MarginEstimator(K, **kwargs)
    with pytest.raises(ValueError, match="^num_positions must be <= 64"):
        MarginEstimator(65)
