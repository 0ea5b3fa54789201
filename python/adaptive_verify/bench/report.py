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
