"""check_imports.MODULES (what install_peers.sh imports every time in CI) names every vLLM/SGLang module that
tests/integration imports, so a new test cannot use a module whose import closure CI never checked.

Reads the sources only; needs no peer package."""
from __future__ import annotations

import ast
from pathlib import Path

from check_imports import MODULES

HERE = Path(__file__).resolve().parent
PEERS = ("vllm", "sglang", "flash_attn")


def imported_peer_modules(source: str) -> set[str]:
    """Peer modules a source imports: `import x` / `from x import y` statements and calls of import_peer /
    importlib.import_module with a literal name."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
            fn = node.func
            name = fn.attr if isinstance(fn, ast.Attribute) else getattr(fn, "id", None)
            if name in ("import_peer", "import_module") and isinstance(node.args[0].value, str):
                found.add(node.args[0].value)
    return {m for m in found if m.split(".")[0] in PEERS}


def test_import_check_covers_every_peer_module_the_tests_import():
    used = set()
    for path in HERE.glob("*.py"):
        if path.name != "check_imports.py":
            used |= imported_peer_modules(path.read_text())
    assert used, "found no peer import at all: the scan is broken"
    assert used <= set(MODULES), f"add to check_imports.MODULES: {sorted(used - set(MODULES))}"


def test_the_scan_sees_every_import_form():
    src = ("import vllm.a\nfrom sglang.b import c\nx = import_peer('vllm.d')\n"
           "y = importlib.import_module('sglang.e')\nimport numpy\nfrom . import peers\n")
    assert imported_peer_modules(src) == {"vllm.a", "sglang.b", "vllm.d", "sglang.e"}


def test_a_missing_package_fails_the_check_naming_it(monkeypatch, capsys):
    import check_imports

    monkeypatch.setattr(check_imports, "MODULES", ("json", "av_no_such_peer_package.sub"))
    assert check_imports.main() == 1
    err = capsys.readouterr().err
    assert "No module named 'av_no_such_peer_package'" in err and "peers.txt" in err
