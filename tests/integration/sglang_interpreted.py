"""Runs SGLang's Triton kernels on the CPU under Triton's interpreter (TRITON_INTERPRET=1), in a process of its
own: the variable changes how every ``triton.jit`` kernel is built, so it must not leak into the test process.

Reads a JSON list of jobs on stdin and writes a JSON list of results on stdout. Jobs:
- {"op": "chain_tree", "bonus": [R], "draft": [R, D], "seq_lens": [R]}: sglang.kernels.ops.speculative.eagle
  ``build_chain_tree`` (the EAGLE topk = 1 verify layout): positions, retrieve index / next token / next sibling,
  tokens, mask.
- {"op": "schedule", "confidence": [R, G], "budget": B, "min_verify_len", "max_verify_len", "survival_eps"}:
  DSpark's ``schedule_verify_lens_topk_triton`` (the GPU kernel of the verify-length schedule).
"""
import json
import os
import sys

assert os.environ.get("TRITON_INTERPRET") == "1", "run with TRITON_INTERPRET=1"

import torch  # noqa: E402

from sglang.kernels.ops.speculative.dspark.dspark_schedule import schedule_verify_lens_topk_triton  # noqa: E402
from sglang.kernels.ops.speculative.eagle import build_chain_tree  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from peers import SGLangScheduleConfig  # noqa: E402


def main():
    out = []
    for job in json.load(sys.stdin):
        if job["op"] == "chain_tree":
            mask, positions, index, nxt, sibling, tokens, _, _ = build_chain_tree(
                torch.tensor(job["bonus"], dtype=torch.int64), torch.tensor(job["draft"], dtype=torch.int64),
                torch.tensor(job["seq_lens"], dtype=torch.int64))
            R, D = len(job["bonus"]), len(job["draft"][0])
            out.append(dict(mask=mask[: R * (D + 1) * (D + 1)].tolist(), positions=positions.tolist(),
                            index=index.tolist(), next=nxt.tolist(), sibling=sibling.tolist(), tokens=tokens.tolist()))
        elif job["op"] == "schedule":
            conf = torch.tensor(job["confidence"], dtype=torch.float32)
            cfg = SGLangScheduleConfig(conf.shape[1], job["min_verify_len"], job["max_verify_len"], job["survival_eps"])
            out.append(schedule_verify_lens_topk_triton(confidence=conf, budget=job["budget"], cfg=cfg).tolist())
        else:
            raise ValueError(f"unknown op {job['op']!r}")
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()
