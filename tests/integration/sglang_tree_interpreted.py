"""SGLang's EAGLE tree (topk > 1) structures on the CPU, in a process of its own (TRITON_INTERPRET=1 changes how
every ``triton.jit`` kernel is built, so it must not leak into the test process).

What is SGLang's own code and what is not:
- the draft loop's token selection (``_select_top_k_tokens_first`` / ``_select_top_k_tokens_later`` of
  sglang/srt/speculative/spec_utils.py) and ``organize_draft_results`` (sglang/srt/speculative/eagle_utils.py) are
  SGLang's functions, run from the installed package's source: their modules do not import on a CPU torch (they
  pull torchvision in through sglang.srt.configs), so each function's definition is taken from the file with ast
  and executed with the names it uses (torch, fast_topk, maybe_detect_oob, all imported from SGLang);
- the loop around them is a stand-in for EAGLE's draft forward: random draft-model distributions over a small
  vocabulary, the model's top-k taken with torch.topk as SGLang's draft does;
- the tree builder (``sgl_build_tree_kernel_triton``) and the greedy tree verify (``verify_tree_greedy_triton``)
  are SGLang's Triton kernels (its XPU path) run under Triton's CPU interpreter. Its CUDA builder (tree.cuh) and
  the bit-packed mask mode (CUDA only) are not run here.

Reads a JSON list of jobs on stdin, writes a JSON list of results on stdout. Jobs:
- {"op": "eagle_tree", "seed", "bs", "topk", "steps", "n", "vocab", "seq_lens": [bs]}: draft loop, then
  organize_draft_results, then the builder in FULL_MASK and QLEN_ONLY modes, then verify_tree_greedy_triton on a
  stand-in target (each token's prediction one of its children's tokens with probability 3/4, else random).
- {"op": "build", "parent_list", "top_scores_index", "seq_lens", "topk", "steps", "n"}: the builder alone on
  given draft-loop outputs (e.g. a draft whose parent was not selected).
"""
import ast
import importlib.util
import json
import os
import sys
from pathlib import Path
from typing import List, Optional, Tuple

assert os.environ.get("TRITON_INTERPRET") == "1", "run with TRITON_INTERPRET=1"

import torch  # noqa: E402

from sglang.kernels.ops.speculative.spec_tree import (  # noqa: E402
    TreeMaskMode,
    sgl_build_tree_kernel_triton,
    verify_tree_greedy_triton,
)
from sglang.srt.utils.async_probe import maybe_detect_oob  # noqa: E402
from sglang.srt.utils.common import fast_topk  # noqa: E402

SGLANG = Path(importlib.util.find_spec("sglang").submodule_search_locations[0])


def sglang_functions(relpath: str, names: list, namespace: dict) -> dict:
    """The named top-level functions of an SGLang source file, defined in namespace (decorators dropped: the one
    there is torch.compile, which changes nothing but speed)."""
    tree = ast.parse((SGLANG / relpath).read_text())
    found = [node for node in tree.body if isinstance(node, ast.FunctionDef) and node.name in names]
    assert sorted(f.name for f in found) == sorted(names), (relpath, names)
    for f in found:
        f.decorator_list = []
    exec(compile(ast.Module(body=found, type_ignores=[]), str(SGLANG / relpath), "exec"), namespace)
    return namespace


NS = dict(torch=torch, fast_topk=fast_topk, maybe_detect_oob=maybe_detect_oob, List=List, Optional=Optional,
          Tuple=Tuple)
sglang_functions("srt/speculative/spec_utils.py", ["_select_top_k_tokens_first", "_select_top_k_tokens_later"], NS)
sglang_functions("srt/speculative/eagle_utils.py", ["organize_draft_results"], NS)


def draft_distributions(g, rows, vocab, topk):
    """Stand-in draft model: a peaked random distribution per row, its top-k as (topk_p, topk_index)."""
    logits = torch.randn(rows, vocab, generator=g) * 3.0
    return torch.topk(torch.softmax(logits, -1), topk, dim=-1)


def eagle_tree(job):
    g = torch.Generator().manual_seed(job["seed"])
    bs, topk, steps, n, vocab = job["bs"], job["topk"], job["steps"], job["n"], job["vocab"]
    score_list, token_list, parents_list = [], [], []
    scores = None
    topk_p, topk_index = draft_distributions(g, bs, vocab, topk)
    for i in range(steps):
        if i == 0:
            _, _, scores, tree_info = NS["_select_top_k_tokens_first"](topk_p, topk_index, None, topk)
        else:
            _, _, scores, tree_info = NS["_select_top_k_tokens_later"](i, topk_p, topk_index, None, scores, topk)
        score_list.append(tree_info[0])
        token_list.append(tree_info[1])
        parents_list.append(tree_info[2])
        if i + 1 < steps:  # the draft model's next step, one distribution per selected token
            topk_p, topk_index = draft_distributions(g, bs * topk, vocab, topk)
    parent_list, top_scores_index, draft_tokens = NS["organize_draft_results"](score_list, token_list, parents_list, n)
    bonus = torch.randint(0, vocab, (bs,), generator=g)
    out = dict(bonus=bonus.tolist(), parent_list=parent_list.tolist(), top_scores_index=top_scores_index.tolist(),
               draft_tokens=draft_tokens.tolist(), parent_list_cols=parent_list.shape[1])
    out.update(build(dict(job, parent_list=parent_list, top_scores_index=top_scores_index)))
    cand = torch.cat([bonus[:, None], draft_tokens], 1)
    out["draft_token"] = cand.flatten().tolist()  # as the builder's caller concatenates it
    full = out["FULL_MASK"]
    target = torch.randint(0, vocab, (bs, n), generator=g)
    for b in range(bs):
        for i in range(n):
            kids, c = [], full["next"][b][i]
            while c != -1:
                kids.append(c)
                c = full["sibling"][b][c]
            if kids and torch.rand(1, generator=g).item() < 0.75:
                target[b, i] = cand[b, kids[int(torch.randint(len(kids), (1,), generator=g))]]
    out["target"] = target.tolist()
    predict = torch.zeros(bs * n, dtype=torch.int32)
    accept_index = torch.full((bs, steps + 1), -1, dtype=torch.int32)  # eagle_sample's width: spec_steps + 1
    accept_num = torch.empty(bs, dtype=torch.int32)
    verify_tree_greedy_triton(predict, accept_index, accept_num, cand, torch.tensor(full["index"]),
                              torch.tensor(full["next"]), torch.tensor(full["sibling"]), target)
    out["greedy"] = dict(predict=predict.tolist(), accept_index=accept_index.tolist(), accept_num=accept_num.tolist())
    return out


def build(job):
    parent_list = torch.as_tensor(job["parent_list"], dtype=torch.int64)
    top_scores_index = torch.as_tensor(job["top_scores_index"], dtype=torch.int64)
    seq_lens = torch.tensor(job["seq_lens"], dtype=torch.int64)
    bs, n, topk, steps = seq_lens.shape[0], job["n"], job["topk"], job["steps"]
    out = {}
    for mode, size in ((TreeMaskMode.FULL_MASK, int(seq_lens.sum()) * n + n * n * bs),
                       (TreeMaskMode.QLEN_ONLY, n * n * bs)):
        mask = torch.full((size,), True, dtype=torch.bool)  # as build_tree_kernel_efficient allocates it
        positions = torch.empty(bs * n, dtype=torch.int64)
        index, nxt, sibling = torch.full((3, bs, n), -1, dtype=torch.int64)
        sgl_build_tree_kernel_triton(parent_list, top_scores_index, seq_lens, mask, positions, index, nxt, sibling,
                                     topk, steps, n, mode)
        out[mode.name] = dict(mask=mask.tolist(), positions=positions.tolist(), index=index.tolist(),
                              next=nxt.tolist(), sibling=sibling.tolist())
    return out


def main():
    out = []
    for job in json.load(sys.stdin):
        out.append({"eagle_tree": eagle_tree, "build": build}[job["op"]](job))
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()
