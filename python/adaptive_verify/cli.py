"""The `adaptive-verify` command.

    adaptive-verify bench planner [options]     planner microbenchmark (CPU; CUDA too when available)
    adaptive-verify bench confidence [options]  confidence-head microbenchmark
    adaptive-verify bench overhead [options]    host time per call: public op vs raw extension call vs torch
    adaptive-verify bench sampling [options]    rejection-sampling microbenchmark
    adaptive-verify bench attention [options]   verification attention (CPU kernel for now) vs padded SDPA
    adaptive-verify bench verifier [options]    AdaptiveVerifier host cost per step, lagged-budget regret
    adaptive-verify calibrate DUMP [options]    fit STS temperatures to a dump of (logits, accepted lengths)
    adaptive-verify sweep [options]             simulate policies x concurrency on a profile (the main job)
    adaptive-verify profiles                    list the simulator's bundled profiles
    adaptive-verify fit POINTS.csv [options]    fit a simulator profile to your serving benchmark
    adaptive-verify demo [options]              generate with the shipped tiny model in every mode
    adaptive-verify info                        how the extension was built and whether CUDA can run
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Optional

BENCHMARKS = {
    "attention": "adaptive_verify.bench.attention",
    "confidence": "adaptive_verify.bench.confidence",
    "overhead": "adaptive_verify.bench.overhead",
    "planner": "adaptive_verify.bench.planner",
    "sampling": "adaptive_verify.bench.sampling",
    "verifier": "adaptive_verify.bench.verifier",
}

CALIBRATE_HELP = """\
Fit sequential temperature scaling (STS) to held-out drafts and write the temperatures as JSON.

DUMP is a .pt file (torch.save of a dict) or a .npz file (numpy.savez) with:
  logits    [N, K] float    the drafter's confidence logits of N rows (blocks) of K drafts
  accepted  [N]    integer  accepted drafts of each row (0..K)
  verified  [N]    integer  drafts verified in each row (optional; default K)

Prints ECE and AUC of the cumulative survival per position, before and after calibration.
Exit status: 0 on success; 1 when the dump or an option's value cannot be used (the message says
why); 2 when the command line cannot be parsed.
"""


def _add_calibrate(sub) -> None:
    from .calibration import DEFAULT_GRID, MIN_ROWS

    c = sub.add_parser(
        "calibrate", help="fit STS temperatures to a dump", description=CALIBRATE_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    c.add_argument("dump", metavar="DUMP", help=".pt or .npz file with logits, accepted (and verified)")
    c.add_argument("--out", metavar="JSON", help="temperatures file (default: DUMP's path, .temperatures.json)")
    c.add_argument("--plot", metavar="PNG", help="also write a reliability diagram (needs matplotlib)")
    grid_min, grid_max, grid_points = DEFAULT_GRID
    c.add_argument("--grid-min", type=float, default=grid_min, help="smallest temperature tried (default %(default)s)")
    c.add_argument("--grid-max", type=float, default=grid_max, help="largest temperature tried (default %(default)s)")
    c.add_argument("--grid-points", type=int, default=grid_points, help="geometric grid size (default %(default)s)")
    c.add_argument("--bins", type=int, default=15, help="equal-width ECE bins (default %(default)s)")
    c.add_argument("--min-rows", type=int, default=MIN_ROWS, help="rows a position needs (default %(default)s)")


def main(argv: Optional[list[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    ap = argparse.ArgumentParser(prog="adaptive-verify", description="Adaptive verification for speculative decoding.")
    sub = ap.add_subparsers(dest="command", required=True)
    b = sub.add_parser("bench", help="run a benchmark", add_help=False)
    b.add_argument("area", choices=sorted(BENCHMARKS), help="which benchmark")
    _add_calibrate(sub)
    from .sim import cli as sim_cli

    sim_cli.add_parsers(sub)
    from .engine import demo

    demo.add_parser(sub)
    sub.add_parser("info", help="build information")
    args, rest = ap.parse_known_args(argv)
    if args.command == "bench":
        import importlib

        return importlib.import_module(BENCHMARKS[args.area]).main(rest)
    if rest:
        ap.error(f"unrecognized arguments: {' '.join(rest)}")
    if args.command == "calibrate":
        return _calibrate(args)
    if args.command == "sweep":
        return sim_cli.run_sweep(args)
    if args.command == "profiles":
        return sim_cli.run_profiles()
    if args.command == "fit":
        return sim_cli.run_fit(args)
    if args.command == "demo":
        return demo.run(args)
    import adaptive_verify

    print(json.dumps(adaptive_verify.build_info(), indent=2))
    return 0


# ----------------------------------------------------------------------------------------------------
# calibrate
# ----------------------------------------------------------------------------------------------------


class _InputError(Exception):
    """A dump or option value that cannot be used: printed as one line, exit status 1."""


def _load_dump(path: str) -> dict:
    """{"logits", "accepted", "verified" (or None)} from a .pt / .npz file. Errors name the file and key."""
    import numpy as np
    import torch

    if not os.path.exists(path):
        raise _InputError(f"{path}: no such file")
    if not os.path.isfile(path):
        raise _InputError(f"{path}: not a file")
    ext = os.path.splitext(path)[1].lower()
    if ext == ".pt" or ext == ".pth":
        try:
            data = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as e:  # torch raises many types for a corrupt or unsafe file
            raise _InputError(f"{path}: cannot read as a torch.save file ({type(e).__name__}: {e})") from None
        if not isinstance(data, dict):
            raise _InputError(
                f"{path}: expected a dict of tensors (torch.save({{'logits': ..., 'accepted': ...}})), "
                f"got {type(data).__name__}"
            )
        get = data.get
        keys = list(data)
    elif ext == ".npz":
        try:
            npz = np.load(path, allow_pickle=False)
        except Exception as e:
            raise _InputError(f"{path}: cannot read as a .npz file ({type(e).__name__}: {e})") from None
        if not hasattr(npz, "files"):
            raise _InputError(f"{path}: expected a .npz archive (numpy.savez), got a single array")
        keys = list(npz.files)
        get = lambda k: npz[k] if k in npz.files else None  # noqa: E731
    else:
        raise _InputError(f"{path}: unknown extension {ext or '(none)'!r}; expected .pt or .npz")
    missing = [k for k in ("logits", "accepted") if get(k) is None]
    if missing:
        found = ", ".join(map(repr, keys)) or "none"
        raise _InputError(f"{path}: missing key(s) {', '.join(map(repr, missing))} (found: {found})")
    return {"logits": get("logits"), "accepted": get("accepted"), "verified": get("verified")}


def _fmt(x: float, digits: int = 4) -> str:
    return "n/a" if x != x else f"{x:.{digits}f}"


def _calibrate(args) -> int:
    from . import calibration as cal

    prog = "adaptive-verify calibrate"
    try:
        if not 0 < args.grid_min < float("inf"):
            raise _InputError(f"--grid-min must be a finite temperature > 0, got {args.grid_min}")
        if not args.grid_min <= args.grid_max < float("inf"):
            raise _InputError(f"--grid-max must be finite and >= --grid-min ({args.grid_min}), got {args.grid_max}")
        if args.grid_points < 1:
            raise _InputError(f"--grid-points must be >= 1, got {args.grid_points}")
        if args.bins < 1:
            raise _InputError(f"--bins must be >= 1, got {args.bins}")
        if args.min_rows < 1:
            raise _InputError(f"--min-rows must be >= 1, got {args.min_rows}")
        dump = _load_dump(args.dump)
        grid = cal.default_grid(args.grid_min, args.grid_max, args.grid_points)
        try:
            temps = cal.fit_sts(
                dump["logits"], dump["accepted"], dump["verified"], grid, num_bins=args.bins, min_rows=args.min_rows
            )
            report = cal.calibration_report(
                dump["logits"], dump["accepted"], dump["verified"], is_logits=True, temperatures=temps,
                num_bins=args.bins, plot=args.plot,
            )
        except (TypeError, ValueError) as e:
            raise _InputError(f"{args.dump}: {e}") from None
        except OSError as e:  # the plot could not be written
            raise _InputError(f"{args.plot}: cannot write the plot ({e.strerror or e})") from None
        out = args.out or os.path.splitext(args.dump)[0] + ".temperatures.json"
        metrics = ("ece", "auc", "ece_overall", "auc_overall", "acceptance", "predicted")
        try:
            cal.save_temperatures(
                out, temps,
                source=os.path.abspath(args.dump), num_rows=report["num_rows"], num_positions=report["num_positions"],
                method="sequential temperature scaling (ECE of cumulative survival)",
                grid={"min": args.grid_min, "max": args.grid_max, "points": args.grid_points}, num_bins=args.bins,
                trials=report["trials"],
                before={k: report[k] for k in metrics}, after={k: report["after"][k] for k in metrics},
            )
        except OSError as e:
            raise _InputError(f"{out}: cannot write the temperatures ({e.strerror or e})") from None
    except _InputError as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        return 1

    _print_table(report, temps.tolist())
    print(f"temperatures written to {out}")
    if args.plot:
        print(f"reliability diagram written to {args.plot}")
    return 0


def _print_table(report: dict, temps: list) -> None:
    after = report["after"]
    print(f"{report['num_rows']} rows, K = {report['num_positions']}: "
          f"ECE ({report['num_bins']} bins) and AUC of the cumulative survival")
    columns = ("position", "rows", "survival", "T", "ECE before", "ECE after", "AUC before", "AUC after")
    print(" ".join(f"{c:>10}" for c in columns))
    for j, t in enumerate(temps):
        cells = (j, report["trials"][j], _fmt(report["acceptance"][j], 3), f"{t:.3f}", _fmt(report["ece"][j]),
                 _fmt(after["ece"][j]), _fmt(report["auc"][j]), _fmt(after["auc"][j]))
        print(" ".join(f"{c:>10}" for c in cells))
    cells = ("overall", sum(report["trials"]), "", "", _fmt(report["ece_overall"]), _fmt(after["ece_overall"]),
             _fmt(report["auc_overall"]), _fmt(after["auc_overall"]))
    print(" ".join(f"{c:>10}" for c in cells))


if __name__ == "__main__":
    raise SystemExit(main())
