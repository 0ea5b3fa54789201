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
