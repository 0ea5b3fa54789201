"""Draft trees vs chains on the bundled profiles: the tables of benchmarks/results/2026-12-01-sim-trees.md.

    python -m adaptive_verify.sim.tree_report --out trees.md [--steps 200] [--seeds 1] [--profiles a,b]

Per profile and concurrency: the best fixed k (chains), the adaptive chains (lagged, global), the best fixed
tree (eagle2-N over N in --eagle), the adaptive trees (tree, tree-lagged), each as tokens/s and its gain over
the best fixed k, plus ``tree`` with --bound (the same trees drafted at a chain's cost: what trees would gain if
drafting them were free). Every run is :func:`adaptive_verify.sim.sweep` with the given settings and one seed, so each
number is also what ``adaptive-verify sweep --profile P --policies ... --steps S --seed S`` prints. The best
fixed k (or N) is the one with the highest mean tokens/s over the seeds; each gain is the mean over the seeds
of policy / best - 1 on the same seed's draws, with its range over the seeds in brackets.
"""
from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from typing import Optional, Sequence

from ..verifier_tree import TREE_WIDTHS
from .profiles import get_profile
from .sweep import DEFAULT_CONCURRENCY, SweepResult, sweep
from .tree import TreeModel

__all__ = ["TreeComparison", "compare_trees", "main"]

DEFAULT_EAGLE = (8, 16, 32, 60)
DEFAULT_PROFILES = ("dsv4-pro-8xb300", "llama3-70b-8xh200")


@dataclasses.dataclass
class TreeComparison:
    """The sweeps of one profile, one per seed: ``main`` (chains, fixed and adaptive trees under ``tree``) and
    ``bound`` (``tree`` with drafting at a chain's cost; empty without --bound)."""

    profile: str
    tree: TreeModel
    main: list[SweepResult]
    bound: list[SweepResult]
    eagle: tuple[int, ...]
    seconds: float

    def tps(self, policy: str, c: int, bound: bool = False) -> list[float]:
        """tokens/s of ``policy`` at ``c``, one per seed."""
        return [r.get(policy, c)["tokens_per_s"] for r in (self.bound if bound else self.main)]

    def best(self, c: int, prefix: str) -> str:
        """The policy named ``prefix``... with the highest mean tokens/s over the seeds at ``c``."""
        names = [p for p in self.main[0].policies() if p.startswith(prefix)]
        return max(names, key=lambda p: _mean(self.tps(p, c)))

    def gain(self, policy: str, c: int, base: str, bound: bool = False) -> str:
        """Mean over the seeds of policy / base - 1 on the same seed's draws, and with several seeds the range."""
        ratios = [100.0 * (x / b - 1.0) for x, b in zip(self.tps(policy, c, bound), self.tps(base, c))]
        text = f"{_mean(ratios):+.1f}%"
        if len(ratios) > 1:
            text += f" ({min(ratios):+.1f}..{max(ratios):+.1f})"
        return text

    def markdown(self) -> list[str]:
        lines = [f"### {self.profile}", "",
                 "| c | best fixed k (tok/s) | lagged | global | best eagle2-N | tree | tree-lagged | tree vs lagged |"
                 + (" tree, chain-cost drafting |" if self.bound else ""),
                 "|---:|---|---:|---:|---|---:|---:|---:|" + ("---:|" if self.bound else "")]
        for c in self.main[0].concurrencies():
            k, e = self.best(c, "k"), self.best(c, "eagle2-")
            cells = [str(c), f"{k} ({_mean(self.tps(k, c)):.0f})"]
            cells += [self.gain(p, c, k) for p in ("lagged", "global")]
            cells.append(f"{e}: {self.gain(e, c, k)}")
            cells += [self.gain(p, c, k) for p in ("tree", "tree-lagged")]
            cells.append(self.gain("tree", c, "lagged"))
            if self.bound:
                cells.append(self.gain("tree", c, k, bound=True))
            lines.append("| " + " | ".join(cells) + " |")
        lines += ["", "Tokens emitted / nodes (drafts) verified per request-step, and mean step ms (seed "
                  f"{self.main[0].settings['seed']}):", "",
                  "| c | best k | lagged | tree | tree-lagged | best eagle2-N |", "|---:|---|---|---|---|---|"]
        for c in self.main[0].concurrencies():
            cells = [str(c)]
            for p in (self.best(c, "k"), "lagged", "tree", "tree-lagged", self.best(c, "eagle2-")):
                r = self.main[0].get(p, c)
                cells.append(f"{p}: {r['emitted_per_step']:.2f} / {r['verified_per_step']:.1f}, "
                             f"{r['mean_step_ms']:.1f} ms")
            lines.append("| " + " | ".join(cells) + " |")
        return lines


def _mean(xs: Sequence[float]) -> float:
    return sum(xs) / len(xs)


def compare_trees(profile: str, *, concurrency: Sequence[int] = DEFAULT_CONCURRENCY, steps: int = 200, seed: int = 0,
                  seeds: int = 1, tree: Optional[TreeModel] = None, eagle: Sequence[int] = DEFAULT_EAGLE,
                  bound: bool = True, progress: bool = False) -> TreeComparison:
    """The sweeps behind one profile's tables (module docstring), one per seed seed..seed+seeds-1."""
    tree = TreeModel() if tree is None else tree
    K = get_profile(profile).drafter.num_drafts
    policies = [f"k{k}" for k in range(1, K + 1)] + ["lagged", "global", "tree", "tree-lagged"]
    policies += [f"eagle2-{n}" for n in eagle]
    start = time.perf_counter()
    main_runs, bound_runs = [], []
    for s in range(seed, seed + seeds):
        kw = dict(concurrency=list(concurrency), steps=steps, seed=s, progress=progress)
        main_runs.append(sweep(profile, policies=policies, tree=tree, **kw))
        if bound:
            bound_runs.append(sweep(profile, policies=["tree"], tree=dataclasses.replace(tree, draft_cost="chain"),
                                    **kw))
    return TreeComparison(profile, tree, main_runs, bound_runs, tuple(eagle), time.perf_counter() - start)


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
    ap.add_argument("--tree-widths", default="uniform", choices=TREE_WIDTHS,
                    help="the adaptive tree policies' beams (default %(default)s)")
    ap.add_argument("--no-bound", action="store_true", help="skip the chain-cost drafting run")
    ap.add_argument("--quiet", action="store_true")
    args = ap.parse_args(argv)
    try:
        tree = TreeModel(top_k=args.tree_topk, sibling_share=args.tree_share, widths=args.tree_widths)
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
