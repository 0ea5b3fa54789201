"""`adaptive-verify demo`: the shipped tiny target and drafter generating text in every mode, side by side."""
from __future__ import annotations

import argparse
import sys

from ..planner import MAX_TREE_NODES
from ..verifier_tree import TREE_WIDTHS

DEMO_HELP = """\
Generate text with the shipped byte-level target and DSpark-style drafter (trained on the Python standard
library's sources) through AdaptiveVerifier, once per mode, and print tokens/s, accepted drafts, verified
drafts and calibration per mode. At temperature 0 every mode generates the same text (lossless).

Chain modes: off (no speculation), all (verify every draft: fixed k), lagged and greedy (adaptive). Tree modes
(the drafter proposes a tree, k alternatives per node, the best N nodes by path confidence, EAGLE-2 style): tree
(adaptive over the trees of every request, live global budget: lossless, trees are verified one-hot) and
tree-fixed (EAGLE-2: every request verifies its N nodes, no global budget). For trees, accepted and verified
count nodes (accepted: the accepted depth).
"""

DEMO_MODES = ["off", "all", "lagged", "greedy", "tree", "tree-fixed"]
#: The tree rows' k and N (chosen on this demo's prompts, 2026-12-01: see docs/engine.md).
DEFAULT_TREE_TOPK = 3
DEFAULT_TREE_NODES = 24

DEFAULT_PROMPTS = ["def __init__(self", "import os\nimport sys\n\n", "    for key, value in ", "class Error(Exception):"]


def add_parser(sub) -> None:
    d = sub.add_parser("demo", help="generate with the shipped tiny model in every mode", description=DEMO_HELP,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    d.add_argument("--prompt", action="append", metavar="TEXT", help="a prompt (repeatable; default: four "
                   "Python snippets)")
    d.add_argument("--concurrency", type=int, default=4, help="requests per step (default %(default)s)")
    d.add_argument("--mode", action="append", choices=DEMO_MODES,
                   help="modes to run (repeatable; default all six)")
    d.add_argument("--max-new-tokens", type=int, default=96, help="bytes per prompt (default %(default)s)")
    d.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default), else sampling")
    d.add_argument("--seed", type=int, default=0)
    d.add_argument("--tree-topk", type=int, default=DEFAULT_TREE_TOPK, help="k of the tree modes: alternatives "
                   "kept per node (default %(default)s)")
    d.add_argument("--tree-nodes", type=int, default=DEFAULT_TREE_NODES, help="N of the tree modes: most nodes per "
                   f"request, 1..{MAX_TREE_NODES} (default %(default)s)")
    d.add_argument("--tree-widths", default="uniform", choices=TREE_WIDTHS,
                   help="the adaptive tree modes' beams: one width for every level, or one per level (default "
                        "%(default)s)")
    d.add_argument("--threads", type=int, default=1, help="torch CPU threads (default %(default)s)")


def run(args) -> int:
    import torch

    from . import load_pretrained
    from .generate import generate

    prog = "adaptive-verify demo"
    if args.concurrency < 1 or args.max_new_tokens < 1 or args.temperature < 0:
        print(f"{prog}: error: --concurrency and --max-new-tokens must be >= 1, --temperature >= 0", file=sys.stderr)
        return 1
    if args.tree_topk < 1 or not 1 <= args.tree_nodes <= MAX_TREE_NODES:
        print(f"{prog}: error: --tree-topk must be >= 1 and --tree-nodes in [1, {MAX_TREE_NODES}]", file=sys.stderr)
        return 1
    torch.set_num_threads(max(1, args.threads))
    try:
        target, drafter = load_pretrained()
    except (OSError, RuntimeError, ValueError) as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        return 1
    prompts = args.prompt or DEFAULT_PROMPTS
    modes = args.mode or DEMO_MODES
    rows, texts = [], {}
    for mode in modes:
        tree = dict(tree_topk=args.tree_topk, tree_nodes=args.tree_nodes,
                    tree_widths=args.tree_widths) if mode.startswith("tree") else {}
        r = generate(target, drafter, prompts, mode=mode, max_new_tokens=args.max_new_tokens,
                     concurrency=args.concurrency, temperature=args.temperature, seed=args.seed, **tree)
        f, m = r.figures, r.figures["verifier"]
        rows.append((mode, f["tokens_per_s"], f["steps"], f["emitted_per_step"], f["drafted_per_step"],
                     f["accepted_per_step"], f["verified_per_step"], m["acceptance_rate"], m["ece"]))
        texts[mode] = r.texts
    print(f"{len(prompts)} prompts x {args.max_new_tokens} bytes, concurrency {args.concurrency}, "
          f"temperature {args.temperature}"
          + (f", trees k = {args.tree_topk}, N = {args.tree_nodes}" if any(m.startswith("tree") for m in modes) else "")
          + "\n")
    print(f"{'mode':>10} | {'tokens/s':>8} | {'steps':>5} | {'tokens/step':>11} | {'drafted':>7} | {'accepted':>8} | "
          f"{'verified':>8} | {'accept rate':>11} | {'ECE':>6}")
    for mode, tps, steps, emitted, drafted, acc, ver, rate, ece in rows:
        print(f"{mode:>10} | {tps:8.1f} | {steps:5d} | {emitted:11.2f} | {drafted:7.2f} | {acc:8.2f} | {ver:8.2f} | "
              f"{rate:11.2f} | {ece:6.3f}")
    print("\n(per request-step: tokens emitted, drafts drafted (lagged, greedy: the draft depth decided with the "
          "budget; all: every draft; tree: the depth and beam decided with the budget, nodes), accepted and verified "
          "(tree rows: nodes, accepted = the accepted depth); ECE of the drafter's confidences on the drafts verified, "
          "per depth for trees)")
    first = modes[0]
    print(f"\n--- {first}: {prompts[0]!r} ->\n{prompts[0]}{texts[first][0]}")
    if args.temperature == 0 and len(modes) > 1:
        same = all(texts[m] == texts[first] for m in modes)
        print(f"\nevery mode generated the same text: {'yes' if same else 'NO (a bug: greedy must be lossless)'}")
    return 0
