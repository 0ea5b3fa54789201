"""The README's quick start runs as written (on CPU tensors): every call, argument and shape it shows is the API's.

The snippet leaves the engine's own parts to the reader (the drafter's output, the model's q/k/v and logits,
the device); this test supplies them and changes nothing else."""
import re
from pathlib import Path

import numpy as np
import torch

README = Path(__file__).resolve().parents[1] / "README.md"


def quick_start() -> str:
    text = README.read_text()
    section = text[text.index("## Quick start"):]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_the_quick_start_runs_as_written():
    code = quick_start()
    # The engine's parts, which the README writes as `...` or names without defining:
    assert 'device="cuda"' in code and "draft_tokens, conf = ...  " in code
    code = code.replace('device="cuda"', 'device="cpu"')
    code = re.sub(r"draft_tokens, conf = \.\.\..*\n", "draft_tokens, conf = drafter()\n", code)
    code = code.replace("av.write_kv(", "k, v, q = model_qkv(plan)\nav.write_kv(", 1)
    code = code.replace("tokens, num_emitted = av.rejection_sample(logits,",
                        "logits = model_logits(plan)\ntokens, num_emitted = av.rejection_sample(logits,", 1)
    rng = np.random.default_rng(0)
    K, R, Hq, Hkv, D, V, blocks, bs = 4, 3, 4, 2, 64, 50, 16, 16
    env = {
        "K": K, "R": R, "slot": 0, "slots": [0, 1, 2], "drafts_host": [4, 2, 3],
        "drafts": torch.tensor([4, 2, 3], dtype=torch.int32),
        "context_lens": torch.tensor([5, 17, 9], dtype=torch.int32),
        "block_table": torch.arange(R * 4, dtype=torch.int32).view(R, 4),
        "anchor_tokens": torch.tensor([7, 8, 9], dtype=torch.int32),
        "k_cache": torch.zeros(blocks, bs, Hkv, D, dtype=torch.bfloat16),
        "v_cache": torch.zeros(blocks, bs, Hkv, D, dtype=torch.bfloat16),
        "temps": torch.tensor([0.0, 1.0, 0.7]), "seeds": torch.tensor([1, 2, 3], dtype=torch.int64),
        "drafter": lambda: (torch.from_numpy(rng.integers(0, V, (R, K)).astype(np.int32)),
                            torch.from_numpy(rng.uniform(0.1, 0.99, (R, K)).astype(np.float32))),
        "model_qkv": lambda plan: tuple(torch.randn(plan.input_ids.shape[0], h, D, dtype=torch.bfloat16)
                                        for h in (Hkv, Hkv, Hq)),
        "model_logits": lambda plan: torch.randn(plan.input_ids.shape[0], V),
    }
    exec(compile(code, str(README), "exec"), env)
    T = env["padded"]
    plan, o, tokens, num_emitted = env["plan"], env["o"], env["tokens"], env["num_emitted"]
    assert plan.input_ids.shape == (T,) and plan.query_start_loc.shape == (R + 1,) and plan.seq_lens.shape == (R,)
    assert o.shape == (T, Hq, D)  # as the comments say
    assert tokens.shape == (R, K + 1) and num_emitted.shape == (R,)
    assert torch.all(num_emitted >= 1) and torch.all(num_emitted - 1 <= plan.verify_lens)
    assert env["verifier"].metrics()["steps"] == 1
