"""The package's layout rules (issue 30): every limit defined once, by the extension, and read by Python; the oracle
(adaptive_verify.reference) shares nothing with the ops it checks and runs without the extension; no import
circle in cost/; models import no op."""
import argparse
import ast
import dataclasses
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import adaptive_verify as av
from adaptive_verify import _C, _validate, attention, planner, sampling
from adaptive_verify.engine import demo

PACKAGE = Path(av.__file__).parent


def i32(values):
    return torch.tensor(values, dtype=torch.int32)


# ----------------------------------------------------------------------------------------------------------
# Imports, read from the sources
# ----------------------------------------------------------------------------------------------------------


def imports_of(source: str, package: str) -> set[str]:
    """Absolute names of the modules ``source`` (a module of ``package``) imports anywhere in it, function bodies and
    TYPE_CHECKING blocks included: ``from . import x`` counts as module ``<package>.x`` when x is one, else as the
    package."""
    names = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1])
                base = f"{base}.{node.module}" if node.module else base
            else:
                base = node.module
            for alias in node.names:
                sub = PACKAGE.parent.joinpath(*f"{base}.{alias.name}".split("."))
                is_module = sub.with_suffix(".py").is_file() or (sub / "__init__.py").is_file()
                names.add(f"{base}.{alias.name}" if is_module else base)
    return names


def imported_modules(path: Path) -> set[str]:
    """imports_of a file of the package (relative imports start from its folder, for an __init__.py too)."""
    return imports_of(path.read_text(), ".".join(path.relative_to(PACKAGE.parent).parts[:-1]))


def python_files(folder: Path) -> list[Path]:
    return sorted(folder.rglob("*.py"))


def test_the_import_reader_sees_every_kind_of_import():
    """The reader the rules below rest on."""
    source = textwrap.dedent("""
        from typing import TYPE_CHECKING
        from . import profile
        from .checks import check_path
        from .. import _checks
        from ..planner.args import PlanArgs
        import adaptive_verify.sampling
        if TYPE_CHECKING:
            from .table import CostTable

        def later():
            from ..confidence import draft_margin
    """)
    assert imports_of(source, "adaptive_verify.cost") == {
        "typing", "adaptive_verify.cost.profile", "adaptive_verify.cost.checks", "adaptive_verify._checks",
        "adaptive_verify.planner.args", "adaptive_verify.sampling", "adaptive_verify.cost.table",
        "adaptive_verify.confidence"}
    assert "adaptive_verify.cost.table" in imported_modules(PACKAGE / "cost" / "__init__.py")
    assert "adaptive_verify.reference.planner" in imported_modules(PACKAGE / "reference" / "trees.py")


def test_reference_imports_nothing_of_the_package_outside_itself():
    """The oracle shares no code with what it checks: no op, no planner type (it returns its own Plan / TreePlan), no
    private field of the cost model. Only torch, numpy and the standard library."""
    outside = {}
    for path in python_files(PACKAGE / "reference"):
        bad = sorted(n for n in imported_modules(path)
                     if n.split(".")[0] == "adaptive_verify" and not n.startswith("adaptive_verify.reference"))
        if bad:
            outside[path.name] = bad
    assert not outside, f"reference/ imports from the package it checks: {outside}"


def test_reference_reads_no_private_field_of_its_arguments():
    """No ``x._name`` read in reference/ other than of its own modules' names (a CostTable is read through its
    public methods: verify_cost, fixed_cost, max_tokens, shifted_by, unshifted)."""
    reads = []
    for path in python_files(PACKAGE / "reference"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
                reads.append(f"{path.name}:{node.lineno} .{node.attr}")
    assert not reads, reads


def test_reference_plans_have_the_ops_field_names():
    from adaptive_verify import reference as ref

    assert [f.name for f in dataclasses.fields(ref.Plan)] == [f.name for f in dataclasses.fields(av.VerifyPlan)]
    assert [f.name for f in dataclasses.fields(ref.TreePlan)] == \
        [f.name for f in dataclasses.fields(av.TreeVerifyPlan)]


# The oracle imported with the extension blocked: the package's own __init__ loads the extension for the ops, so the
# package is stood in for by a bare module over the same folder, and any import of adaptive_verify._C fails.
_WITHOUT_EXTENSION = textwrap.dedent("""
    import importlib.abc, sys, types

    class NoExtension(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name == "adaptive_verify._C" or name.startswith("adaptive_verify._C."):
                raise ImportError("blocked: " + name)
            return None

    sys.meta_path.insert(0, NoExtension())
    package = types.ModuleType("adaptive_verify")
    package.__path__ = [sys.argv[1]]
    sys.modules["adaptive_verify"] = package

    import torch
    from adaptive_verify import reference as ref

    i32 = lambda v: torch.tensor(v, dtype=torch.int32)
    survival = ref.prefix_survival(torch.tensor([[0.9, 0.5, 0.2], [0.3, 0.8, 0.1]]), i32([3, 2]))
    plan = ref.plan_verification(survival, i32([3, 2]), mode="fixed", budget=3)
    assert plan.verify_lens.tolist() == [2, 1] and int(plan.budget) == 3, plan
    tree = ref.plan_tree_verification(torch.tensor([[0.9, 0.8, 0.1]]), i32([[-1, 0, -1]]), i32([3]), mode="all")
    assert tree.token_depth.tolist() == [0, 1, 2, 1], tree
    loaded = sorted(m for m in sys.modules if m.startswith("adaptive_verify.") and
                    not m.startswith("adaptive_verify.reference"))
    assert not loaded, loaded
    print("ok")
""")


def test_reference_runs_without_the_extension():
    done = subprocess.run([sys.executable, "-c", _WITHOUT_EXTENSION, str(PACKAGE)], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr


def test_the_extension_blocker_blocks():
    """The stand-in above really has no extension: the ops fail to import under it."""
    script = _WITHOUT_EXTENSION.split("import torch")[0] + "from adaptive_verify import _ext\n"
    done = subprocess.run([sys.executable, "-c", script, str(PACKAGE)], capture_output=True, text=True, timeout=300)
    assert done.returncode != 0 and "adaptive_verify._C is missing" in done.stderr, done.stderr


def import_graph(folder: Path) -> dict[str, set[str]]:
    """module -> the modules of the same package it imports."""
    package = ".".join(folder.relative_to(PACKAGE.parent).parts)
    graph = {}
    for path in python_files(folder):
        name = package if path.name == "__init__.py" else f"{package}.{path.stem}"
        graph[name] = {n for n in imported_modules(path) if n.startswith(package + ".") or n == package} - {name}
    return graph


def find_cycle(graph: dict[str, set[str]]):
    """A cycle of the graph as a list of modules, or None."""
    state, stack = {}, []

    def visit(node):
        state[node] = "open"
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == "open":
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        state[node] = "done"
        stack.pop()
        return None

    for node in sorted(graph):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return None


def test_cycle_finder_finds_a_cycle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None


@pytest.mark.parametrize("area", ["cost", "reference"])
def test_no_import_circle(area):
    graph = import_graph(PACKAGE / area)
    assert len(graph) > 3
    cycle = find_cycle(graph)
    assert cycle is None, f"{area}/ has an import circle: {' -> '.join(cycle)}"


def test_cost_table_is_the_only_hub():
    """cost/'s helpers (checks, curve, profile, roofline, serialize) import no other module of cost/ but checks, the
    leaf; table.py is the one module that brings them together."""
    graph = import_graph(PACKAGE / "cost")
    for name, deps in graph.items():
        if name.rsplit(".", 1)[-1] in ("checks", "curve", "profile", "roofline", "serialize"):
            assert deps <= {"adaptive_verify.cost.checks"}, (name, deps)


def test_models_import_no_op():
    """margin.py (MarginEstimator, a model) takes its feature as a tensor; the op computing it (draft_margin) is the
    caller's."""
    ops = {"adaptive_verify." + m for m in ("attention", "confidence", "sampling", "stats", "verifier", "planner")}
    names = imported_modules(PACKAGE / "margin.py")
    assert not {n for n in names if any(n == op or n.startswith(op + ".") for op in ops)}, names


# ----------------------------------------------------------------------------------------------------------
# Limits: the extension's values, read by Python, and the checks at exactly those values
# ----------------------------------------------------------------------------------------------------------


def test_python_limits_are_the_extensions():
    assert _validate.MAX_DRAFTS == planner.MAX_DRAFTS == _C.PLANNER_MAX_DRAFTS == 32
    assert planner.MAX_REQS == _C.PLANNER_MAX_REQS == (1 << 26) - 2
    assert planner.MAX_TREE_NODES == _C.PLANNER_MAX_TREE_NODES == 63
    assert planner.MAX_TREE_REQS == _C.PLANNER_MAX_TREE_REQS == (1 << 21) - 1
    assert planner.MAX_CONTEXT_LEN == _C.PLANNER_MAX_CONTEXT_LEN == 2**31 - 65
    assert sampling.MAX_TREE_TOKENS == _C.SAMPLER_MAX_TREE_TOKENS == planner.MAX_TREE_NODES + 1
    assert attention.MAX_QUERY_LEN == _C.ATTENTION_MAX_QUERY_LEN
    # A chain's K + 1 tokens and a tree's anchor and nodes must fit one attention call and one 64-bit mask.
    assert attention.MAX_QUERY_LEN >= max(planner.MAX_DRAFTS + 1, planner.MAX_TREE_NODES + 1)
    # The largest context plus a request's most tokens still fits int32 (positions and seq_lens).
    assert planner.MAX_CONTEXT_LEN + attention.MAX_QUERY_LEN <= 2**31 - 1


def _limit_message(limit):
    return rf"must be in \[1, {limit}\]"


def test_drafts_limit_is_checked_at_max_drafts():
    K = planner.MAX_DRAFTS
    conf = torch.full((2, K + 1), 0.5)
    drafts = i32([K, K])
    assert av.prefix_survival(conf[:, :K], drafts).shape == (2, K)
    with pytest.raises(ValueError, match=_limit_message(K)):
        av.prefix_survival(conf, drafts)
    with pytest.raises(ValueError, match=_limit_message(K)):
        av.plan_verification(conf, drafts, mode="all")
    av.plan_verification(conf[:, :K], drafts, mode="all")
    with pytest.raises(ValueError, match=_limit_message(K)):
        av.confidence_from_logits(torch.zeros(2, K + 1))
    assert av.confidence_from_logits(torch.zeros(2, K)).shape == (2, K)


def test_tree_limits_are_checked_at_max_tree_nodes():
    N = planner.MAX_TREE_NODES
    parents = torch.arange(-1, N, dtype=torch.int32)[None, :]  # a chain of N + 1 nodes
    conf = torch.full((1, N + 1), 0.5)
    plan = av.plan_tree_verification(conf[:, :N], parents[:, :N], i32([N]), mode="all")
    assert int(plan.budget) == N
    with pytest.raises(ValueError, match=_limit_message(N)):
        av.plan_tree_verification(conf, parents, i32([N + 1]), mode="all")
    with pytest.raises(ValueError, match=_limit_message(N)):
        av.tree_survival(conf, parents, i32([N + 1]))


def test_tree_sampler_width_is_checked_at_max_tree_tokens():
    W = sampling.MAX_TREE_TOKENS
    logits = torch.zeros(W, 5)
    qsl = i32([0, W])
    parent = torch.arange(-1, W - 1, dtype=torch.int32)
    ids = torch.zeros(W, dtype=torch.int32)
    tokens, emitted = av.tree_rejection_sample(logits, qsl, parent, ids, W)[:2]
    assert tokens.shape == (1, W)
    with pytest.raises(ValueError, match=rf"max_query_len must be in \[1, {W}\] \(the anchor and at most {W - 1} "):
        av.tree_rejection_sample(logits, qsl, parent, ids, W + 1)


def test_context_limit_is_the_kernels():
    """context_lens up to MAX_CONTEXT_LEN plan; one more is the kernel's own refusal."""
    survival, drafts = torch.full((1, 3), 0.5), i32([3])
    plan = av.plan_verification(survival, drafts, mode="all", context_lens=i32([planner.MAX_CONTEXT_LEN]))
    assert int(plan.seq_lens[0]) == planner.MAX_CONTEXT_LEN + 4
    with pytest.raises(ValueError, match="context_lens"):
        av.plan_verification(survival, drafts, mode="all", context_lens=i32([planner.MAX_CONTEXT_LEN + 1]))


def test_request_limit_is_checked_at_max_reqs():
    with pytest.raises(ValueError, match=f"num_reqs_padded must be <= {planner.MAX_REQS}, got {planner.MAX_REQS + 1}"):
        av.VerifyPlan.allocate(planner.MAX_REQS + 1, 1)


def test_command_line_limits_follow_the_constants(capsys, tmp_path):
    from adaptive_verify import cli

    args = argparse.Namespace(tree_topk=1, tree_nodes=planner.MAX_TREE_NODES + 1, concurrency=1, max_new_tokens=1,
                              temperature=0.0)
    assert demo.run(args) == 1
    assert f"--tree-nodes in [1, {planner.MAX_TREE_NODES}]" in capsys.readouterr().err
    points = tmp_path / "points.csv"
    points.write_text("policy,concurrency,tokens_per_s\nnone,1,10\n")
    code = cli.main(["fit", str(points), "--drafts", str(planner.MAX_DRAFTS + 1), "--prompt-len", "64",
                     "--output-len", "64", "--out", str(tmp_path / "p.json")])
    assert code == 1
    assert f"--drafts must be in [1, {planner.MAX_DRAFTS}], got {planner.MAX_DRAFTS + 1}" in capsys.readouterr().err


@pytest.mark.parametrize("command, text", [("sweep", f"N in [1, {planner.MAX_TREE_NODES}]"),
                                           ("demo", f"1..{planner.MAX_TREE_NODES}")])
def test_help_texts_name_the_limits(command, text, capsys):
    from adaptive_verify import cli

    with pytest.raises(SystemExit) as done:
        cli.main([command, "--help"])
    assert done.value.code == 0
    assert text in " ".join(capsys.readouterr().out.split())  # argparse rewraps the demo's option help


LIMITS = ("MAX_DRAFTS", "MAX_REQS", "MAX_TREE_NODES", "MAX_TREE_REQS", "MAX_CONTEXT_LEN", "MAX_TREE_TOKENS",
          "MAX_QUERY_LEN")


def test_limits_are_defined_once_by_reading_the_extension():
    """Each limit is assigned in one module, from _C; no other module assigns it a number."""
    defined, numbers = {}, []
    for path in python_files(PACKAGE):
        rel = path.relative_to(PACKAGE).as_posix()
        for node in ast.parse(path.read_text()).body:  # module level
            targets = node.targets if isinstance(node, ast.Assign) else [node.target] \
                if isinstance(node, ast.AnnAssign) else []
            for name in {t.id for t in targets if isinstance(t, ast.Name)} & set(LIMITS):
                value = node.value
                if isinstance(value, ast.Attribute) and isinstance(value.value, ast.Name) and value.value.id == "_C":
                    defined.setdefault(name, []).append(rel)
                else:
                    numbers.append(f"{rel}:{node.lineno} {name} = {ast.unparse(value)}")
    assert {name: len(where) for name, where in defined.items()} == dict.fromkeys(LIMITS, 1), defined
    assert not numbers, numbers


#: A module longer than this is doing more than one thing (issue 30); split it by what it holds.
MAX_MODULE_LINES = 600


def test_no_module_is_over_600_lines():
    long = {p.relative_to(PACKAGE).as_posix(): n for p in python_files(PACKAGE)
            if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES}
    assert not long, f"modules over {MAX_MODULE_LINES} lines: {long}"


def foreign_private_reads(path: Path) -> list[str]:
    """``x._name`` reads in a module where x is not ``self`` (nor ``cls``): another object's private member."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__") and not (
                isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")):
            found.append(f"{path.name}:{node.lineno} {ast.unparse(node)}")
    return found


def test_the_foreign_private_reader_finds_them(tmp_path):
    f = tmp_path / "m.py"
    f.write_text("class A:\n    def f(self, v):\n        return self._x + v._gen + v.slots._y + v.__class__\n")
    assert sorted(x.split(" ")[1] for x in foreign_private_reads(f)) == ["v._gen", "v.slots._y"]


@pytest.mark.parametrize("module", ["verifier_tree.py", "verifier_slots.py", "sim/engine.py"])
def test_verifier_parts_read_no_other_objects_privates(module):
    """The tree side and the slot table are told what they need (issue 30: no module reaches into another's private
    members); the simulator drives the verifier through its public calls only."""
    assert foreign_private_reads(PACKAGE / module) == []


@pytest.mark.parametrize("name", ["MAX_POSITIONS", "MAX_TOKENS"])
def test_python_only_limits_are_assigned_once(name):
    """Limits that are the package's own (not the extension's) are still written in one module."""
    def names(node):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        return [t.id for t in targets if isinstance(t, ast.Name)]

    where = [p.relative_to(PACKAGE).as_posix() for p in python_files(PACKAGE) for node in ast.parse(p.read_text()).body
             if isinstance(node, (ast.Assign, ast.AnnAssign)) and name in names(node)]
    assert len(where) == 1, where
