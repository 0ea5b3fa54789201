"""Markdown tables for benchmark reports."""


def _fmt(v, digits=1):
    if isinstance(v, bool):
        return "yes" if v else "NO"
    if isinstance(v, float):
        return f"{v:.{digits}f}"
    return str(v)


def markdown_table(rows: list[dict], columns: list[tuple[str, str]]) -> str:
    head = "| " + " | ".join(title for _, title in columns) + " |"
    sep = "|" + "|".join("---:" for _ in columns) + "|"
    body = ["| " + " | ".join(_fmt(r[key]) for key, _ in columns) + " |" for r in rows]
    return "\n".join([head, sep, *body])


def cli_main(argv, *, prog: str, description: str, add_arguments, run, report) -> int:
    """The shared command line of every benchmark: its own options, then --json / --markdown outputs.

    run(args) -> result dict; report(result) -> markdown text (printed, and written with --markdown)."""
    import argparse
    import json

    ap = argparse.ArgumentParser(prog=prog, description=description)
    add_arguments(ap)
    ap.add_argument("--json", help="also write the raw results to this JSON file")
    ap.add_argument("--markdown", help="also write the report to this markdown file")
    args = ap.parse_args(argv)
    result = run(args)
    text = report(result)
    print(text)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(text)
    return 0


def cpu_cuda_result(kind: str, cases, bench_cpu, bench_cuda, *, use_cuda: bool, min_time_s: float) -> dict:
    """A CPU-and-CUDA microbenchmark's result: the date, host, torch and threads, ``kind: True`` (which report reads
    it), bench_cpu(*case, min_time_s=) per case, and on CUDA the device's name and bench_cuda(*case) per case."""
    import datetime
    import platform

    import torch

    result = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "host": platform.processor() or platform.machine(),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        kind: True,
        "cpu": [bench_cpu(*case, min_time_s=min_time_s) for case in cases],
    }
    if use_cuda:
        result["gpu"] = torch.cuda.get_device_name()
        result["cuda"] = [bench_cuda(*case) for case in cases]
    return result


def cpu_cuda_report(title: str, intro: str, result: dict, cpu_columns, cuda_columns) -> str:
    """The report of a cpu_cuda_result: a heading with the date, torch and threads, the intro, the CPU table and,
    when measured, the CUDA table."""
    lines = [f"## {title} ({result['date']}, torch {result['torch']}, {result['threads']} CPU threads)", "", intro, "",
             markdown_table(result["cpu"], cpu_columns)]
    if "cuda" in result:
        lines += ["", f"### CUDA: {result['gpu']}", "", markdown_table(result["cuda"], cuda_columns)]
    return "\n".join(lines) + "\n"
