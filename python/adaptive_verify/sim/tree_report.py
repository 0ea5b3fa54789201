"""Draft trees vs chains on the bundled profiles: the tables of benchmarks/results/2026-12-01-sim-trees.md.

    python -m adaptive_verify.sim.tree_report --out trees.md [--steps 200] [--seeds 1] [--profiles a,b]

Per profile and concurrency: the best fixed k (chains), the adaptive chains (lagged, global), the best fixed
tree (eagle2-N over N in --eagle), the adaptive trees (tree, tree-lagged), each as tokens/s and its gain over
the best fixed k, plus ``tree`` with --bound (the same trees drafted at a chain's cost: what trees would gain if
drafting them were free). Every run is :func:`adaptive_verify.sim.sweep` with the given settings, so each number
is also what ``adaptive-verify sweep --profile P --policies ... --steps S --seeds N`` prints. With several seeds
each gain is of the means over the seeds, and ``±x`` the standard deviation of that policy's tokens/s over the
seeds in % of the best fixed k's mean.
"""
from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from typing import Iterable, Optional, Sequence

from .profiles import get_profile
from .sweep import DEFAULT_CONCURRENCY, SweepResult, sweep
from .tree import TreeModel

__all__ = ["TreeComparison", "compare_trees", "main"]

DEFAULT_EAGLE = (8, 16, 32, 60)
DEFAULT_PROFILES = ("dsv4-pro-8xb300", "llama3-70b-8xh200")


@dataclasses.dataclass
class TreeComparison:
    """The sweeps of one profile: ``main`` (chains, fixed and adaptive trees under ``tree``) and ``bound`` (tree
    policies with drafting at a chain's cost; None without --bound)."""

    profile: str
    tree: TreeModel
    main: SweepResult
    bound: Optional[SweepResult]
    eagle: tuple[int, ...]
    seconds: float

    def best(self, c: int, prefix: str, names: Iterable[str]) -> tuple[str, float]:
        rows = [self.main.get(p, c) for p in names if p.startswith(prefix)]
        top = max(rows, key=lambda r: r["tokens_per_s"])
        return top["policy"], top["tokens_per_s"]

    def markdown(self) -> list[str]:
        pols = self.main.policies()
        lines = [f"### {self.profile}", "",
                 "| c | best fixed k (tok/s) | lagged | global | best eagle2-N | tree | tree-lagged | tree vs lagged |"
                 + (" tree, chain-cost drafting |" if self.bound else ""),
                 "|---:|---|---:|---:|---|---:|---:|---:|" + ("---:|" if self.bound else "")]
        for c in self.main.concurrencies():
            kname, kbest = self.best(c, "k", pols)
            ename, ebest = self.best(c, "eagle2-", pols)
            rows = {p: self.main.get(p, c) for p in ("lagged", "global", "tree", "tree-lagged")}
            if self.bound:
                rows["bound"] = self.bound.get("tree", c)
            g = {p: r["tokens_per_s"] for p, r in rows.items()}
            sd = {p: _spread(r, kbest) for p, r in rows.items()}  # "" for one seed
            cells = [str(c), f"{kname} ({kbest:.0f})"]
            cells += [_gain(g[p], kbest) + sd[p] for p in ("lagged", "global")]
            cells.append(f"{ename}: {_gain(ebest, kbest)}")
            cells += [_gain(g[p], kbest) + sd[p] for p in ("tree", "tree-lagged")]
            cells.append(_gain(g["tree"], g["lagged"]))
            if self.bound:
                cells.append(_gain(g["bound"], kbest) + sd["bound"])
            lines.append("| " + " | ".join(cells) + " |")
        lines += ["", "Tokens emitted / nodes (drafts) verified per request-step, and mean step ms:", "",
                  "| c | best k | lagged | tree | tree-lagged | best eagle2-N |", "|---:|---|---|---|---|---|"]
        for c in self.main.concurrencies():
            cells = [str(c)]
            for p in (self.best(c, "k", pols)[0], "lagged", "tree", "tree-lagged", self.best(c, "eagle2-", pols)[0]):
                r = self.main.get(p, c)
                cells.append(f"{p}: {r['emitted_per_step']:.2f} / {r['verified_per_step']:.1f}, "
                             f"{r['mean_step_ms']:.1f} ms")
            lines.append("| " + " | ".join(cells) + " |")
        return lines


def _gain(x: float, base: float) -> str:
    return f"{100.0 * (x / base - 1.0):+.1f}%"


def _spread(row: dict, base: float) -> str:
    """With several seeds: the standard deviation of the row's tokens/s over the seeds, in % of ``base``."""
    if row.get("seeds", 1) < 2:
        return ""
    return f" ±{100.0 * row['tokens_per_s_sd'] / base:.1f}"


def compare_trees(profile: str, *, concurrency: Sequence[int] = DEFAULT_CONCURRENCY, steps: int = 200, seed: int = 0,
                  seeds: int = 1, tree: Optional[TreeModel] = None, eagle: Sequence[int] = DEFAULT_EAGLE,
                  bound: bool = True, progress: bool = False) -> TreeComparison:
    """The sweeps behind one profile's tables (module docstring)."""
    tree = TreeModel() if tree is None else tree
    K = get_profile(profile).drafter.num_drafts
    policies = [f"k{k}" for k in range(1, K + 1)] + ["lagged", "global", "tree", "tree-lagged"]
    policies += [f"eagle2-{n}" for n in eagle]
    start = time.perf_counter()
    kw = dict(concurrency=list(concurrency), steps=steps, seed=seed, seeds=seeds, progress=progress)
    main_sweep = sweep(profile, policies=policies, tree=tree, **kw)
    bound_sweep = None
    if bound:
        bound_sweep = sweep(profile, policies=["tree"], tree=dataclasses.replace(tree, draft_cost="chain"), **kw)
    return TreeComparison(profile, tree, main_sweep, bound_sweep, tuple(eagle), time.perf_counter() - start)


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m adaptive_verify.sim.tree_report", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=None, metavar="FILE.md", help="write the tables here (default: print them)")
    ap.add_argument("--profiles", default=",".join(DEFAULT_PROFILES), metavar="LIST")
    ap.add_argument("--concurrency", default=",".join(map(str, DEFAULT_CONCURRENCY)), metavar="LIST")
    ap.add_argument("--steps", type=int, default=200, help="measured steps per point (default %(default)s)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--seeds", type=int, default=1)
    ap.add_argument("--eagle", default=",".join(map(str, DEFAULT_EAGLE)), metavar="LIST", help="N of eagle2-N")
    ap.add_argument("--tree-topk", type=int, default=4)
    ap.add_argument("--tree-share", type=float, default=0.5)
    ap.add_argument("--no-bound", action="store_true", help="skip the chain-cost drafting run")
    ap.add_argument("--quiet", action="store_true")
    args = ap.parse_args(argv)
    try:
        tree = TreeModel(top_k=args.tree_topk, sibling_share=args.tree_share)
        cs = [int(x) for x in args.concurrency.split(",") if x]
        eagle = [int(x) for x in args.eagle.split(",") if x]
        lines = []
        for name in [p for p in args.profiles.split(",") if p]:
            cmp = compare_trees(name, concurrency=cs, steps=args.steps, seed=args.seed, seeds=args.seeds, tree=tree,
                                eagle=eagle, bound=not args.no_bound, progress=not args.quiet)
            lines += cmp.markdown() + ["", f"({cmp.seconds:.0f} s)", ""]
    except ValueError as e:
        print(f"tree_report: error: {e}", file=sys.stderr)
        return 1
    text = "\n".join(lines)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    else:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
