"""`sweep`: every (policy, concurrency) of a profile, the Pareto frontier, and the files the CLI writes."""
from __future__ import annotations

import csv
import dataclasses
import json
import math
import os
import sys
import time
from dataclasses import dataclass, field
from typing import Callable, Iterable, Optional, Sequence, Union

from .engine import parse_policy, simulate
from .model import Priority, Profile
from .overhead import Overhead, overhead_preset
from .profiles import get_profile
from .tree import TreeModel

__all__ = ["SweepResult", "sweep", "default_policies", "DEFAULT_CONCURRENCY", "pareto_frontier"]

DEFAULT_CONCURRENCY = (1, 2, 4, 8, 16, 32, 64, 128, 256)
COLUMNS = ("policy", "concurrency", "tokens_per_s", "tpot_ms", "user_tokens_per_s", "emitted_per_step",
           "verified_per_step", "mean_step_ms", "p99_step_ms", "longest_step_ms", "mean_step_tokens",
           "waiting_fraction", "head_auc", "head_ece", "steps", "simulated_s", "seeds", "tokens_per_s_sd", "tpot_ms_sd",
           "on_frontier")
# Sweeps with priority classes (workload.priority) add these, per class, to every row and the CSV.
CLASS_COLUMNS = ("tpot_ms_high", "tpot_ms_low", "tokens_per_s_high", "tokens_per_s_low")


def default_policies(num_drafts: int) -> list[str]:
    """none, k1..kK, greedy, lagged, global."""
    return ["none"] + [f"k{k}" for k in range(1, num_drafts + 1)] + ["greedy", "lagged", "global"]


def pareto_frontier(rows: Sequence[dict]) -> list[int]:
    """Indices of the rows no other row beats on both tokens_per_s and user_tokens_per_s (ties kept)."""
    keep = []
    for i, a in enumerate(rows):
        dominated = any(
            b["tokens_per_s"] >= a["tokens_per_s"] and b["user_tokens_per_s"] >= a["user_tokens_per_s"]
            and (b["tokens_per_s"] > a["tokens_per_s"] or b["user_tokens_per_s"] > a["user_tokens_per_s"])
            for j, b in enumerate(rows) if j != i)
        if not dominated:
            keep.append(i)
    return keep


@dataclass
class SweepResult:
    """rows: one dict per (policy, concurrency) with the COLUMNS keys (and CLASS_COLUMNS with priority
    classes); profile: the profile's dict."""

    profile: dict
    rows: list[dict]
    settings: dict = field(default_factory=dict)

    def get(self, policy: str, concurrency: int) -> dict:
        for r in self.rows:
            if r["policy"] == policy and r["concurrency"] == concurrency:
                return r
        raise KeyError(f"no row for policy {policy!r} at concurrency {concurrency}")

    def policies(self) -> list[str]:
        return list(dict.fromkeys(r["policy"] for r in self.rows))

    def concurrencies(self) -> list[int]:
        return sorted({r["concurrency"] for r in self.rows})

    @property
    def classes(self) -> bool:
        """Whether the runs had priority classes (rows then carry CLASS_COLUMNS)."""
        return self.settings.get("priority") is not None

    def table(self) -> str:
        """Terminal table: tokens/s and TPOT per policy (rows) and concurrency (columns); with several seeds,
        the mean and its spread (one standard deviation over the seeds) of tokens/s."""
        cs = self.concurrencies()
        spread = any(r.get("seeds", 1) > 1 for r in self.rows)
        width = 21 if spread else 15
        pw = max([8] + [len(p) for p in self.policies()])
        head = f"{'policy':>{pw}} | " + " | ".join(f"c={c:<4}".rjust(width) for c in cs)
        title = "output tokens/s (TPOT ms); * = on the Pareto frontier"
        if spread:
            title = (f"output tokens/s, mean +- sd over {self.rows[0]['seeds']} seeds (mean TPOT ms); "
                     "* = on the Pareto frontier of the means")
        lines = [title, head, "-" * len(head)]
        for p in self.policies():
            cells = []
            for c in cs:
                r = self.get(p, c)
                tput = f"{r['tokens_per_s']:7.0f}"
                if spread:
                    tput += f"+-{r['tokens_per_s_sd']:<4.0f}"
                cells.append(f"{tput} ({r['tpot_ms']:5.1f}){'*' if r['on_frontier'] else ' '}")
            lines.append(f"{p:>{pw}} | " + " | ".join(x.rjust(width) for x in cells))
        if self.classes:
            lines += ["", *self._class_table()]
        return "\n".join(lines)

    def _class_table(self) -> list[str]:
        """TPOT per priority class: high / low, one cell per (policy, concurrency)."""
        prio = self.settings["priority"]
        cs, width = self.concurrencies(), 15
        pw = max([8] + [len(p) for p in self.policies()])
        head = f"{'policy':>{pw}} | " + " | ".join(f"c={c:<4}".rjust(width) for c in cs)
        title = (f"TPOT ms per priority class: high (fraction {prio['fraction']:g}, weight {prio['weight']:g}) "
                 "/ low (weight 1)")
        lines = [title, head, "-" * len(head)]
        for p in self.policies():
            cells = [f"{r['tpot_ms_high']:5.1f} / {r['tpot_ms_low']:5.1f}" for r in (self.get(p, c) for c in cs)]
            lines.append(f"{p:>{pw}} | " + " | ".join(x.rjust(width) for x in cells))
        return lines

    def to_json(self, path: str | os.PathLike) -> None:
        with open(path, "w") as f:
            json.dump({"profile": self.profile, "settings": self.settings, "rows": self.rows}, f, indent=1)

    def to_csv(self, path: str | os.PathLike) -> None:
        with open(path, "w", newline="") as f:
            columns = COLUMNS + (CLASS_COLUMNS if self.classes else ())
            w = csv.DictWriter(f, fieldnames=columns)
            w.writeheader()
            for r in self.rows:
                w.writerow({k: r[k] for k in columns})

    def plot(self, path: str | os.PathLike) -> None:
        """PNG: the Pareto frontier (throughput vs per-user tokens/s) and throughput vs concurrency."""
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, (ax0, ax1) = plt.subplots(1, 2, figsize=(13, 5))
        fixed = [p for p in self.policies() if p.startswith("k")]
        slos = [p for p in self.policies() if p.startswith("slo")]
        eagles = [p for p in self.policies() if p.startswith("eagle2-")]
        shades, slo_shades, eagle_shades = plt.get_cmap("Blues"), plt.get_cmap("Greens"), plt.get_cmap("Greys")
        named = {"none": dict(color="black", ls="-", lw=1.4), "greedy": dict(color="tab:red", ls="-", lw=2.4),
                 "lagged": dict(color="tab:orange", ls="-", lw=2.0), "global": dict(color="tab:purple", ls="--", lw=1.4),
                 "tree": dict(color="tab:brown", ls="-", lw=2.4), "tree-lagged": dict(color="tab:pink", ls="-", lw=2.0)}
        for p in self.policies():
            rs = sorted((r for r in self.rows if r["policy"] == p), key=lambda r: r["concurrency"])
            if p in named:
                style = named[p]
            elif p in slos:  # lagged with a step-time target: lagged's solid line, in greens
                style = dict(color=slo_shades(0.45 + 0.5 * slos.index(p) / max(len(slos) - 1, 1)), ls="-", lw=1.6)
            elif p in eagles:  # fixed trees: dash-dotted, in greys
                style = dict(color=eagle_shades(0.4 + 0.5 * eagles.index(p) / max(len(eagles) - 1, 1)), ls="-.", lw=1.2)
            else:
                style = dict(color=shades(0.35 + 0.6 * fixed.index(p) / max(len(fixed) - 1, 1)), ls=":", lw=1.2)
            ax0.plot([r["user_tokens_per_s"] for r in rs], [r["tokens_per_s"] for r in rs], marker="o", ms=3,
                     label=p, **style)
            ax1.plot([r["concurrency"] for r in rs], [r["tokens_per_s"] for r in rs], marker="o", ms=3, label=p,
                     **style)
        front = sorted((r for r in self.rows if r["on_frontier"]), key=lambda r: r["user_tokens_per_s"])
        ax0.plot([r["user_tokens_per_s"] for r in front], [r["tokens_per_s"] for r in front], color="tab:green",
                 lw=6, alpha=0.25, label="Pareto frontier", zorder=0)
        ax0.set_xlabel("per-user output tokens/s (1000 / TPOT)")
        ax0.set_ylabel("output tokens/s")
        ax0.set_title("throughput vs interactivity")
        ax1.set_xscale("log", base=2)
        ax1.set_xlabel("concurrency")
        ax1.set_ylabel("output tokens/s")
        ax1.set_title("throughput vs concurrency")
        for ax in (ax0, ax1):
            ax.grid(alpha=0.3)
        ax0.legend(fontsize=8, ncol=2)
        fig.suptitle(f"adaptive-verify sweep: {self.profile.get('name', '')}", fontsize=10)
        fig.tight_layout()
        fig.savefig(path, dpi=110)
        plt.close(fig)

    def write(self, out_dir: str | os.PathLike, plot: bool = True) -> dict[str, str]:
        """sweep.csv, sweep.json and (plot=True) sweep.png under out_dir; returns their paths."""
        os.makedirs(out_dir, exist_ok=True)
        paths = {"csv": os.path.join(out_dir, "sweep.csv"), "json": os.path.join(out_dir, "sweep.json")}
        self.to_csv(paths["csv"])
        self.to_json(paths["json"])
        if plot:
            try:
                import matplotlib  # noqa: F401
            except ImportError:
                print("sweep: matplotlib is not installed, so no sweep.png (pip install 'adaptive-verify[plot]')",
                      file=sys.stderr)
                return paths
            paths["png"] = os.path.join(out_dir, "sweep.png")
            self.plot(paths["png"])
        return paths


def _progress_bar(total: int, stream=sys.stderr) -> Callable[[int, str], None]:
    start = time.perf_counter()

    def update(done: int, label: str) -> None:
        width = 30
        filled = width * done // max(total, 1)
        elapsed = time.perf_counter() - start
        stream.write(f"\r[{'#' * filled}{'.' * (width - filled)}] {done}/{total} {label:<16} {elapsed:5.1f}s")
        if done == total:
            stream.write("\n")
        stream.flush()

    return update


def _mean_over_seeds(runs: list[dict]) -> dict:
    """One row from the runs of one point under several seeds: the mean of every number, the sample standard
    deviation of tokens/s and TPOT (NaN for a single seed), and the seed count."""
    row = dict(runs[0])
    for key, value in runs[0].items():
        if isinstance(value, (int, float)) and not isinstance(value, bool) and key != "concurrency":
            row[key] = sum(r[key] for r in runs) / len(runs)
    for key in ("tokens_per_s", "tpot_ms"):
        if len(runs) > 1:
            mean = row[key]
            row[f"{key}_sd"] = math.sqrt(sum((r[key] - mean) ** 2 for r in runs) / (len(runs) - 1))
        else:
            row[f"{key}_sd"] = float("nan")
    row["steps"] = runs[0]["steps"]
    row["seeds"] = len(runs)
    return row


def sweep(profile: Profile | str = "dsv4-pro-8xb300", *, concurrency: Iterable[int] = DEFAULT_CONCURRENCY,
          policies: Optional[Iterable[str]] = None, steps: int = 400, warmup: Optional[int] = None, seed: int = 0,
          seeds: int = 1, overhead: Union[str, Overhead, None] = None,
          priority: Union[str, Priority, None] = None, tree: Optional[TreeModel] = None,
          progress: bool = False, full_draft: bool = False) -> SweepResult:
    """Simulates every policy at every concurrency and marks the Pareto frontier.

    profile: a :class:`Profile` or a bundled profile's name (``adaptive-verify profiles`` lists them).
    concurrency: ints >= 1 (at most the profile's token capacity). policies: names for
    :func:`~adaptive_verify.sim.engine.parse_policy`; default none, k1..kK, greedy, lagged, global; add
    ``slo<ms>`` (e.g. ``slo40``) for lagged with a step-time target of <ms> milliseconds.
    steps: measured steps per point (>= 1), times 16 // c below concurrency 16 (low concurrencies see few
    requests per step); warmup: unmeasured steps first (default steps // 4, scaled the same way).
    seeds: runs per point (>= 1), with seeds ``seed .. seed + seeds - 1``; each row is their mean, with
    ``tokens_per_s_sd`` / ``tpot_ms_sd`` the spread (sample standard deviation; NaN for one seed).
    overhead: the adaptive path's cost per step, a preset name (``device``, ``host``, ``none``) or an
    :class:`~adaptive_verify.sim.overhead.Overhead`, replacing the profile's; None keeps the profile's.
    priority: two request classes, ``"FRACTION:WEIGHT"`` or a :class:`~adaptive_verify.sim.model.Priority`
    (a fraction of the requests weighs WEIGHT in the planner, the rest 1), replacing the workload's; None
    keeps the profile's. With classes every row also has CLASS_COLUMNS (TPOT and tokens/s per class).
    tree: the draft-tree model of the tree policies (``tree``, ``tree-lagged``, ``eagle2-<N>``), a
    :class:`~adaptive_verify.sim.tree.TreeModel` (default ``TreeModel()``: top-4, the profile's depth, 63 nodes).
    full_draft: the adaptive chain policies draft every level and decide only the budget (before the draft depth;
    :func:`~adaptive_verify.sim.engine.simulate`'s flag), for comparison. Same arguments and seed, same numbers.
    """
    if isinstance(profile, str):
        profile = get_profile(profile)
    if not isinstance(profile, Profile):
        raise TypeError(f"profile must be a Profile or a bundled profile's name, got {type(profile).__name__}")
    cs = list(concurrency)
    if not cs:
        raise ValueError("concurrency must list at least one value")
    for c in cs:
        if isinstance(c, bool) or not isinstance(c, int) or c < 1:
            raise ValueError(f"concurrency values must be ints >= 1, got {c!r}")
        if c > profile.capacity:
            raise ValueError(f"concurrency {c} exceeds the profile's token capacity {profile.capacity}")
    names = default_policies(profile.drafter.num_drafts) if policies is None else list(policies)
    if not names:
        raise ValueError("policies must list at least one policy")
    pols = [parse_policy(n, profile.drafter.num_drafts) for n in names]
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps must be an int >= 1, got {steps!r}")
    warmup = steps // 4 if warmup is None else warmup
    if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 0:
        raise ValueError(f"warmup must be an int >= 0, got {warmup!r}")
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ValueError(f"seed must be an int >= 0, got {seed!r}")
    if isinstance(seeds, bool) or not isinstance(seeds, int) or seeds < 1:
        raise ValueError(f"seeds must be an int >= 1, got {seeds!r}")
    if overhead is not None:
        if isinstance(overhead, str):
            overhead = overhead_preset(overhead)
        if not isinstance(overhead, Overhead):
            raise TypeError(f"overhead must be a preset name, an Overhead or None, got {type(overhead).__name__}")
        profile = dataclasses.replace(profile, overhead=overhead)
    if tree is None:
        tree = TreeModel()
    if not isinstance(tree, TreeModel):
        raise TypeError(f"tree must be a TreeModel or None, got {type(tree).__name__}")
    if any(p.tree for p in pols):
        tree.depth(profile.drafter.num_drafts)  # a depth past the profile's drafts names itself before any run
    if priority is not None:
        if isinstance(priority, str):
            priority = Priority.parse(priority)
        if not isinstance(priority, Priority):
            raise TypeError(f"priority must be 'FRACTION:WEIGHT', a Priority or None, got {type(priority).__name__}")
        profile = dataclasses.replace(profile, workload=dataclasses.replace(profile.workload, priority=priority))

    total = len(pols) * len(cs) * seeds
    bar = _progress_bar(total) if progress else None
    rows, done = [], 0
    for c in cs:
        for pol in pols:
            # Low concurrencies see few requests per step: run them longer for comparable sample sizes.
            n = steps * max(1, 16 // c)
            runs = []
            for s in range(seed, seed + seeds):
                runs.append(simulate(profile, pol, c, steps=n, warmup=warmup * max(1, 16 // c), seed=s, tree=tree,
                                     full_draft=full_draft))
                done += 1
                if bar:
                    bar(done, f"{pol.name} c={c}")
            rows.append(_mean_over_seeds(runs))
    front = set(pareto_frontier(rows))
    for i, r in enumerate(rows):
        r["on_frontier"] = i in front
    settings = {"concurrency": cs, "policies": names, "steps": steps, "warmup": warmup, "seed": seed,
                "seeds": seeds, "adaptive_overhead": profile.overhead.to_dict(),
                "priority": None if profile.workload.priority is None else profile.workload.priority.to_dict()}
    if any(p.tree for p in pols):  # absent otherwise: chain-only sweeps write what they wrote before
        settings["tree"] = tree.to_dict()
    if full_draft:
        settings["full_draft"] = True
    return SweepResult(profile=profile.to_dict(), rows=rows, settings=settings)
