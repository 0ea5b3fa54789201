"""What the engine tests share (chains and trees): the pretrained models, the prompts, per-position token counts and
the chi-square tests of sampled tokens."""
import numpy as np
from scipy import stats


def token_counts(tokens, index):
    """[256] counts of the byte at position ``index`` over every generated sequence."""
    return np.bincount([t[index] for t in tokens], minlength=256)


def chi2_same(a, b):
    """Two-sample chi-square on categorical counts (bins with enough mass; the rest pooled): the p-value that a and
    b come from one distribution."""
    keep = (a + b) >= 10
    table = np.array([np.append(a[keep], a[~keep].sum()), np.append(b[keep], b[~keep].sum())])
    table = table[:, table.sum(0) > 0]
    return stats.chi2_contingency(table)[1]


#: Prompts of different lengths joining and leaving the batch (the greedy identity tests).
PROMPTS = ["def __init__(self, ", "import os\n", "    return sorted(", "class Error(Exception):\n    \"\"\"",
           "for i in range(len(", "x"]
_models: list = []


def pretrained():
    """(target, drafter): the shipped weights, loaded once per process, on one torch thread."""
    if not _models:
        import torch

        from adaptive_verify.engine import load_pretrained

        torch.set_num_threads(1)
        _models.append(load_pretrained())
    return _models[0]


#: The sampling tests' prompt, its count and the tokens judged (the first decode step drafts min(K, NEW - 2) = 6:
#: every draft position, or every tree depth, is verified and judged).
PROMPT, SAMPLES, NEW = "def ", 1200, 8
_plain: dict = {}


def plain_samples(target):
    """SAMPLES plain samples (mode "off", temperature 1) of NEW tokens after PROMPT; made once per process (the chain
    and the tree tests compare against the same set)."""
    key = id(target)
    if key not in _plain:
        from adaptive_verify.engine.generate import generate

        _plain[key] = (target, generate(target, None, [PROMPT] * SAMPLES, mode="off", max_new_tokens=NEW,
                                        concurrency=64, temperature=1.0, seed=10_000).tokens)
    return _plain[key][1]


def second_token_pvalue(target, tokens) -> float:
    """Chi-square p-value of the generated second tokens against the target's exact law after PROMPT: the sum over
    first tokens t1 of p(t1) p(t2 | t1)."""
    import torch

    with torch.no_grad():
        ids = torch.tensor([list(PROMPT.encode())])
        p1 = torch.softmax(target.forward_dense(ids, attn_dtype=torch.float16)[0][0, -1], -1)
        both = torch.cat([ids.repeat(256, 1), torch.arange(256)[:, None]], 1)
        p2 = torch.softmax(target.forward_dense(both, attn_dtype=torch.float16)[0][:, -1], -1)
        exact = (p1[:, None] * p2).sum(0).double().numpy()
    counts = token_counts(tokens, 1)
    expected = exact * len(tokens)
    keep = expected >= 5
    obs = np.append(counts[keep], counts[~keep].sum())
    exp = np.append(expected[keep], expected[~keep].sum())
    return stats.chisquare(obs, exp * obs.sum() / exp.sum()).pvalue
