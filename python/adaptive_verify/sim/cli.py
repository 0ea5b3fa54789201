"""`adaptive-verify sweep`, `adaptive-verify fit` and `adaptive-verify profiles`."""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

from ..planner import MAX_DRAFTS, MAX_TREE_NODES
from ..verifier_tree import TREE_WIDTHS

SWEEP_HELP = """\
Simulate a serving loop at each concurrency for no speculation, every fixed k and the adaptive planner
(greedy, lagged, and global as an upper bound), and show the throughput / per-user-speed Pareto frontier.
The library's real planner (its C++ CPU kernel) makes every adaptive decision.

Inputs: a bundled profile (--profile NAME, see `adaptive-verify profiles`), a profile JSON file
(--profile FILE.json), or your own cost table and acceptance model (--cost-table FILE --acceptance FILE):
  cost table   CostTable.to_json() output, e.g. from CostTable.profile on your GPU; its max_tokens is the
               token capacity per step
  acceptance   {"acceptance": {"conditional": [...], ...}, "drafter": {"num_drafts": K, "kind": "block"},
                "workload": {"prompt_len": 1024, "output_len": 512}}   (workload optional)

The adaptive policies also pay the adaptive path's own cost per step (confidence head, planner, budget copy):
--overhead device (this library's kernels, measured on an H200; the default unless the profile says
otherwise), host (a host-side planner: ~0.2 ms more per step) or none. --seeds N runs every point with N
seeds and reports the mean and the spread (standard deviation) of each.

Latency targets and priorities (the planner's max_step_ms and weights):
  slo<ms>      a policy (e.g. --policies lagged,slo40): lagged, with no step charged more than <ms>
               milliseconds (adaptive overhead included) unless its decodes and prompt chunks alone, verifying
               no draft, already cost more
  --priority FRACTION:WEIGHT
               two request classes: each request is high priority with probability FRACTION (drawn at
               admission, seeded) and weighs WEIGHT in the planner, the others weigh 1; the table, CSV and
               JSON then add TPOT and tokens/s per class (tpot_ms_high, tpot_ms_low, tokens_per_s_high,
               tokens_per_s_low). Fixed k and none verify regardless of weight: their classes differ by chance

Draft trees (EAGLE-2-shaped: top-k per node, a beam of k per depth; see adaptive_verify/sim/tree.py):
  tree         the planner's global budget over every request's tree nodes on this step's confidences
               (trees are verified one-hot, so this is lossless live)
  tree-lagged  the budget from each request's previous tree, priced at this step
  eagle2-<N>   each request's N best nodes by path confidence (N in [1, %d], e.g. eagle2-16, eagle2-60)
  --tree-topk K, --tree-depth D, --tree-share S (the share of the remaining probability each next-ranked
  sibling takes), --tree-draft-cost levels|chain (one drafter forward per level, or a tree costs a chain's)
  e.g. --policies k3,lagged,tree,tree-lagged,eagle2-16,eagle2-60

Writes OUT/sweep.csv, OUT/sweep.json and OUT/sweep.png (Pareto frontier and throughput vs concurrency).
Exit status: 0 on success; 1 when an input cannot be used (the message says why); 2 on a bad command line.
""" % MAX_TREE_NODES


FIT_HELP = """\
Fit a simulator profile to your own serving benchmark: measured no-speculation and fixed-k points in,
a profile JSON out (for `adaptive-verify sweep --profile FILE.json`, which then predicts adaptive).

POINTS.csv has columns policy,concurrency,tokens_per_s and optionally tpot_ms (other columns are ignored,
lines starting with # are comments). policy is none or k<N>; rows with greedy, lagged or global are held
back: not fitted, simulated on the fitted profile and reported next to their measurement.

What is fitted: the verification forward's cost curve over tokens per step and the drafter's cost (unless
--draft-ms gives it), and with --request-term a per-request cost of every step. What you give: --drafts,
--prompt-len, --output-len, and if you know them the acceptance per position (--acceptance), the token
capacity per step (--capacity, vLLM's max_num_batched_tokens; else one of 1024..16384 is chosen by fit) and
the drafter's cost. The curve between the token counts your points run at is interpolated smoothly
(--smoothness): measure k<N> at several concurrencies to pin it where the planner will operate.

--acceptance FILE.json: {"per_position": [a_0, ..., a_{K-1}]} (the fraction of drafted blocks whose
draft j was accepted, as vLLM's spec-decode metrics report it) or {"acceptance": {...}} (the simulator's
model, as `sweep --acceptance` files hold it). Without it the default profile's acceptance is assumed.

Prints the fit's quality per point (the simulated value is what `sweep` reports on the written profile
with the same seeds and steps) and writes --out. Deterministic for a --seed.
Exit status: 0 on success; 1 when an input cannot be used (the message says why); 2 on a bad command line.
"""


class _InputError(Exception):
    pass


def _int_list(name: str, text: str) -> list[int]:
    try:
        vals = [int(x) for x in text.replace(" ", "").split(",") if x]
    except ValueError:
        raise _InputError(f"{name} must be a comma-separated list of ints, got {text!r}") from None
    if not vals:
        raise _InputError(f"{name} must list at least one value")
    for v in vals:
        if v < 1:
            raise _InputError(f"{name} values must be >= 1, got {v}")
    return vals


def add_parsers(sub) -> None:
    s = sub.add_parser("sweep", help="simulate policies x concurrency; Pareto frontier", description=SWEEP_HELP,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    s.add_argument("--profile", default=None, metavar="NAME|FILE",
                   help="bundled profile name or profile JSON (default dsv4-pro-8xb300)")
    s.add_argument("--cost-table", metavar="FILE", help="CostTable JSON (with --acceptance)")
    s.add_argument("--acceptance", metavar="FILE", help="acceptance/drafter/workload JSON (with --cost-table)")
    s.add_argument("--concurrency", default=None, metavar="LIST", help="e.g. 1,2,4,...,256 (the default)")
    s.add_argument("--policies", default=None, metavar="LIST",
                   help="e.g. none,k1,k7,greedy,lagged,global,slo40,tree,tree-lagged,eagle2-16 (default: none, every "
                        "k, greedy, lagged, global; slo<ms>: lagged with a step-time target; tree policies below)")
    s.add_argument("--steps", type=int, default=400, help="measured steps per point (default %(default)s; "
                   "concurrency c < 16 runs steps * (16 // c))")
    s.add_argument("--seed", type=int, default=0, help="random seed (default %(default)s)")
    s.add_argument("--seeds", type=int, default=1, metavar="N",
                   help="seeds per point, SEED..SEED+N-1: mean and spread per point (default %(default)s)")
    s.add_argument("--overhead", default=None, metavar="PRESET",
                   help="the adaptive path's cost per step: device, host or none (default: the profile's, "
                        "device unless it says otherwise)")
    s.add_argument("--priority", default=None, metavar="FRACTION:WEIGHT",
                   help="priority classes: FRACTION of the requests weigh WEIGHT in the planner, the rest 1 "
                        "(default: the profile's, one class unless it says otherwise)")
    s.add_argument("--tree-topk", type=int, default=4, metavar="K",
                   help="tree policies: alternatives per node and beam width (default %(default)s)")
    s.add_argument("--tree-depth", type=int, default=None, metavar="D",
                   help="tree policies: deepest level (default: the profile's drafts per step)")
    s.add_argument("--tree-share", type=float, default=0.5, metavar="S",
                   help="tree policies: each next-ranked alternative's share of the probability the higher-ranked "
                        "ones leave, in (0, 1) (default %(default)s)")
    s.add_argument("--tree-draft-cost", default="levels", choices=("levels", "chain"),
                   help="tree policies: levels = one drafter forward per level over the beam; chain = a tree costs "
                        "what the chain costs (an upper bound) (default %(default)s)")
    s.add_argument("--tree-widths", default="uniform", choices=TREE_WIDTHS,
                   help="adaptive tree policies: one beam width for every level, or a width per level (default "
                        "%(default)s)")
    s.add_argument("--full-draft", action="store_true",
                   help="adaptive chain policies draft every level (the budget alone is adaptive), for comparison "
                        "with the default, which decides the draft depth too")
    s.add_argument("--out", default=None, metavar="DIR", help="output folder (default sweep-<profile name>)")
    s.add_argument("--no-plot", action="store_true", help="skip the PNG (no matplotlib needed)")
    s.add_argument("--quiet", action="store_true", help="no progress bar")
    sub.add_parser("profiles", help="list the bundled simulator profiles")
    f = sub.add_parser("fit", help="fit a simulator profile to your serving benchmark", description=FIT_HELP,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    f.add_argument("points", metavar="POINTS.csv", help="measured points: policy,concurrency,tokens_per_s[,tpot_ms]")
    f.add_argument("--drafts", type=int, required=True, metavar="K", help="drafts per request per step (K)")
    f.add_argument("--drafter-kind", default="block", choices=("block", "chain"),
                   help="block: one drafter pass drafts all K (DSpark, MTP); chain: one pass per draft (EAGLE) "
                        "(default %(default)s)")
    f.add_argument("--prompt-len", required=True, metavar="MIN:MAX", help="prompt tokens per request (or N)")
    f.add_argument("--output-len", required=True, metavar="MIN:MAX", help="output tokens per request (or N)")
    f.add_argument("--prefill-chunk", type=int, default=2048, metavar="N",
                   help="most prompt tokens one request prefills per step (default %(default)s)")
    f.add_argument("--tensor-parallel", type=int, default=None, metavar="N",
                   help="tensor-parallel size (recorded in the profile; the measurements already include it)")
    f.add_argument("--acceptance", metavar="FILE.json", help="measured acceptance per position (see above)")
    f.add_argument("--capacity", type=int, default=None, metavar="TOKENS",
                   help="token capacity per step (default: the smallest of 1024, 2048, ..., 16384 that fits "
                        "within 2%% of the best)")
    f.add_argument("--draft-ms", default=None, metavar="MS|R:MS,...",
                   help="the drafter's measured cost per step, constant or at request counts (default: fitted)")
    f.add_argument("--request-term", action="store_true", help="also fit a per-request cost of every step")
    f.add_argument("--smoothness", type=float, default=None, metavar="W",
                   help="bend penalty of the cost curve where no point constrains it (default 0.1)")
    f.add_argument("--overhead", default="device", metavar="PRESET",
                   help="adaptive overhead preset written into the profile: device, host or none (default %(default)s)")
    f.add_argument("--seed", type=int, default=0, help="first random seed (default %(default)s)")
    f.add_argument("--seeds", type=int, default=3, metavar="N", help="simulated runs per point (default %(default)s)")
    f.add_argument("--steps", type=int, default=400, help="measured steps per run (default %(default)s)")
    f.add_argument("--name", default=None, help="the profile's name (default: the CSV file's name)")
    f.add_argument("--out", default=None, metavar="FILE.json", help="profile to write (default NAME.profile.json)")
    f.add_argument("--quiet", action="store_true", help="no progress bar")


def _load(args):
    from ..cost import CostTable
    from .model import Acceptance, Drafter, Profile, Workload, load_profile_file
    from .profiles import PROFILES, get_profile

    if args.cost_table or args.acceptance:
        if args.profile is not None:
            raise _InputError("give either --profile or --cost-table with --acceptance, not both")
        if not (args.cost_table and args.acceptance):
            raise _InputError("--cost-table and --acceptance go together: give both")
        for path in (args.cost_table, args.acceptance):
            if not os.path.isfile(path):
                raise _InputError(f"{path}: no such file")
        table = CostTable.from_json(args.cost_table)
        try:
            with open(args.acceptance) as f:
                data = json.load(f)
        except json.JSONDecodeError as e:
            raise _InputError(f"{args.acceptance}: not valid JSON ({e})") from None
        where = args.acceptance
        if not isinstance(data, dict):
            raise _InputError(f"{where}: expected a JSON object with 'acceptance' and 'drafter'")
        for key in ("acceptance", "drafter"):
            if key not in data:
                raise _InputError(f"{where}: missing key {key!r}")
        name = os.path.splitext(os.path.basename(args.cost_table))[0]
        return Profile(name=name, description=f"{args.cost_table} + {args.acceptance}", cost_table=table,
                       acceptance=Acceptance.from_dict(data["acceptance"], f"{where}: acceptance"),
                       drafter=Drafter.from_dict(data["drafter"], f"{where}: drafter"),
                       workload=Workload.from_dict(data["workload"], f"{where}: workload") if "workload" in data
                       else Workload())
    name = args.profile or "dsv4-pro-8xb300"
    if name in PROFILES:
        return get_profile(name)
    if name.endswith(".json") or os.path.sep in name:
        if not os.path.isfile(name):
            raise _InputError(f"{name}: no such file")
        return load_profile_file(name)
    raise _InputError(f"unknown profile {name!r}; bundled profiles: {', '.join(sorted(PROFILES))} "
                      "(or give a profile .json file)")


def run_sweep(args) -> int:
    from .model import Priority
    from .overhead import OVERHEAD_PRESETS
    from .sweep import DEFAULT_CONCURRENCY, sweep
    from .tree import TreeModel

    prog = "adaptive-verify sweep"
    try:
        profile = _load(args)
        cs = _int_list("--concurrency", args.concurrency) if args.concurrency else list(DEFAULT_CONCURRENCY)
        pols = [p for p in args.policies.replace(" ", "").split(",") if p] if args.policies else None
        if args.steps < 1:
            raise _InputError(f"--steps must be >= 1, got {args.steps}")
        if args.seed < 0:
            raise _InputError(f"--seed must be >= 0, got {args.seed}")
        if args.seeds < 1:
            raise _InputError(f"--seeds must be >= 1, got {args.seeds}")
        if args.overhead is not None and args.overhead not in OVERHEAD_PRESETS:
            raise _InputError(f"--overhead must be one of {', '.join(OVERHEAD_PRESETS)}, got {args.overhead!r}")
        priority = Priority.parse(args.priority, "--priority") if args.priority is not None else None
        try:
            tree = TreeModel(top_k=args.tree_topk, max_depth=args.tree_depth, sibling_share=args.tree_share,
                             draft_cost=args.tree_draft_cost, widths=args.tree_widths)
            tree.depth(profile.drafter.num_drafts)
        except ValueError as e:  # "tree.top_k must ..." -> the flag's name
            flag = {"top_k": "--tree-topk", "max_depth": "--tree-depth", "sibling_share": "--tree-share"}
            field = str(e).split(" ")[0].removeprefix("tree.")
            raise _InputError(f"{flag.get(field, '--tree')}: {e}") from None
        start = time.perf_counter()
        result = sweep(profile, concurrency=cs, policies=pols, steps=args.steps, seed=args.seed, seeds=args.seeds,
                       overhead=args.overhead, priority=priority, tree=tree, progress=not args.quiet,
                       full_draft=args.full_draft)
        elapsed = time.perf_counter() - start
        out = args.out or f"sweep-{profile.name}"
        paths = result.write(out, plot=not args.no_plot)
    except (_InputError, ValueError, TypeError, OSError) as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        return 1
    print(f"profile {profile.name}: {profile.description}")
    print(f"adaptive overhead per step: {_describe_overhead(args.overhead or profile.overhead.to_dict(), profile)}")
    print(result.table())
    print(f"\n{len(result.rows)} points in {elapsed:.1f} s; wrote {', '.join(paths.values())}")
    return 0


def _describe_overhead(choice, profile) -> str:
    from .overhead import Overhead, overhead_preset

    o = overhead_preset(choice) if isinstance(choice, str) else Overhead.from_dict(choice)
    name = f"{o.preset}: " if o.preset else ""
    return f"{name}{1000 * o.fixed_ms:.0f} us + {1000 * o.per_request_ms:.3f} us per request"


def run_profiles() -> int:
    from .profiles import list_profiles

    for name, desc in list_profiles():
        print(f"{name:<20} {desc}")
    return 0


def _len_range(flag: str, text: str) -> tuple[int, int]:
    """MIN:MAX or N -> (MIN, MAX)."""
    parts = text.split(":")
    try:
        vals = [int(x) for x in parts]
    except ValueError:
        vals = []
    if len(vals) not in (1, 2) or len(vals) != len(parts):
        raise _InputError(f"{flag} must be MIN:MAX or N (ints), got {text!r}")
    lo, hi = vals[0], vals[-1]
    if lo < 1 or hi < lo:
        raise _InputError(f"{flag} must satisfy 1 <= MIN <= MAX, got {text!r}")
    return lo, hi


def _draft_points(flag: str, text: str) -> dict[int, float]:
    """MS (a constant cost) or R:MS,R:MS,... (increasing request counts)."""
    try:
        if ":" not in text:
            return {1: float(text)}
        out = {}
        for item in text.replace(" ", "").split(","):
            r, ms = item.split(":")
            out[int(r)] = float(ms)
        return out
    except ValueError:
        raise _InputError(f"{flag} must be MS or R:MS,R:MS,... (e.g. 1:0.9,256:2.5), got {text!r}") from None


def run_fit(args) -> int:
    from .fit import DEFAULT_PENALTY, fit_profile
    from .fit_inputs import default_acceptance, read_acceptance, read_points_csv
    from .overhead import OVERHEAD_PRESETS
    from .sweep import _progress_bar

    prog = "adaptive-verify fit"
    try:
        if not os.path.isfile(args.points):
            raise _InputError(f"{args.points}: no such file")
        if not 1 <= args.drafts <= MAX_DRAFTS:
            raise _InputError(f"--drafts must be in [1, {MAX_DRAFTS}], got {args.drafts}")
        prompt = _len_range("--prompt-len", args.prompt_len)
        output = _len_range("--output-len", args.output_len)
        if output[0] < 2:
            raise _InputError(f"--output-len must be at least 2 tokens, got {args.output_len!r}")
        for flag, value, lo in (("--prefill-chunk", args.prefill_chunk, 1), ("--seeds", args.seeds, 1),
                                ("--steps", args.steps, 4), ("--seed", args.seed, 0)):
            if value < lo:
                raise _InputError(f"{flag} must be >= {lo}, got {value}")
        if args.tensor_parallel is not None and args.tensor_parallel < 1:
            raise _InputError(f"--tensor-parallel must be >= 1, got {args.tensor_parallel}")
        if args.capacity is not None and args.capacity < 1:
            raise _InputError(f"--capacity must be >= 1, got {args.capacity}")
        penalty = DEFAULT_PENALTY if args.smoothness is None else args.smoothness
        if not penalty >= 0 or penalty == float("inf"):
            raise _InputError(f"--smoothness must be a finite number >= 0, got {args.smoothness}")
        if args.overhead not in OVERHEAD_PRESETS:
            raise _InputError(f"--overhead must be one of {', '.join(OVERHEAD_PRESETS)}, got {args.overhead!r}")
        draft_ms = _draft_points("--draft-ms", args.draft_ms) if args.draft_ms is not None else None
        points = read_points_csv(args.points, args.drafts)
        assumed = []
        if args.acceptance:
            if not os.path.isfile(args.acceptance):
                raise _InputError(f"{args.acceptance}: no such file")
            acceptance, how = read_acceptance(args.acceptance, args.drafts)
        else:
            acceptance = default_acceptance(args.drafts)
            how = (f"the default profile's acceptance model {list(acceptance.conditional)} (no --acceptance "
                   "given: measure it, it moves every prediction)")
        assumed.append(f"acceptance: {how}")
        stem = os.path.splitext(os.path.basename(args.points))[0]
        name = args.name or stem
        out = args.out or f"{name}.profile.json"
        try:
            bar: dict = {}

            def progress(done: int, total: int, label: str) -> None:
                if args.quiet:
                    return
                if "update" not in bar:  # sized at the first run, when the fit knows how many it will simulate
                    bar["update"] = _progress_bar(total)
                bar["update"](done, label)

            result = fit_profile(
                points, num_drafts=args.drafts, acceptance=acceptance, prompt_len=prompt, output_len=output,
                prefill_chunk=args.prefill_chunk, drafter_kind=args.drafter_kind, capacity=args.capacity,
                request_term=args.request_term, draft_ms=draft_ms, penalty=penalty, overhead=args.overhead,
                tensor_parallel=args.tensor_parallel, seed=args.seed, seeds=args.seeds, steps=args.steps,
                name=name, source=os.path.basename(args.points), assumed=assumed, progress=progress)
        except (TypeError, ValueError) as e:
            if "draft_ms" in str(e).split(" ")[0]:
                raise _InputError(f"--draft-ms: {e}") from None
            raise
        text = json.dumps(result.profile, indent=1, allow_nan=False) + "\n"
        try:
            with open(out, "w", encoding="utf-8") as f:
                f.write(text)
        except OSError as e:
            raise _InputError(f"{out}: cannot write the profile ({e.strerror or e})") from None
    except (_InputError, ValueError, TypeError) as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        return 1
    settings = result.settings
    print(f"fitted {name}: capacity {settings['capacity']} tokens per step"
          + ("" if settings["capacity_given"] else " (chosen: " + ", ".join(
              f"{c}: {v:.4f}" for c, v in result.capacities.items()) + " squared log error)")
          + f", {settings['seeds']} seeds x {settings['steps']} steps per point")
    print(result.table())
    print(f"\n{result.seconds:.1f} s; wrote {out}; next: adaptive-verify sweep --profile {out}")
    return 0

