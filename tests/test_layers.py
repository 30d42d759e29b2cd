"""The house rules of docs/architecture.md: imports point down; the few imports inside functions say why."""

import ast
import pathlib
import subprocess
import sys

import pytest

import gpunets as gn
from gpunets import verbs

ROOT = pathlib.Path(gn.__file__).parent


def _local_internal_imports() -> list[tuple[str, int, str]]:
    """(file, line, source line) of every gpunets import inside a function (``TYPE_CHECKING`` blocks aside)."""
    out = []
    for path in sorted(ROOT.rglob("*.py")):
        text = path.read_text()
        lines = text.splitlines()
        for fn in ast.walk(ast.parse(text)):
            if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for node in ast.walk(fn):
                internal = (isinstance(node, ast.ImportFrom) and (node.level > 0 or (node.module or "").startswith("gpunets"))
                            or isinstance(node, ast.Import) and any(a.name.startswith("gpunets") for a in node.names))
                if internal:
                    out.append((str(path.relative_to(ROOT.parent)), node.lineno, lines[node.lineno - 1]))
    return sorted(set(out))


def test_every_internal_import_inside_a_function_says_why_it_is_lazy():
    found = _local_internal_imports()
    missing = [f"{f}:{n}: {line.strip()}" for f, n, line in found if "# lazy:" not in line]
    assert not missing, "internal imports inside functions need a '# lazy: <reason>' comment:\n" + "\n".join(missing)
    n_modules = len(list(ROOT.rglob("*.py")))
    assert len(found) <= n_modules / 3, f"{len(found)} local imports for {n_modules} modules: import at the top"


def test_lower_layers_reach_the_api_only_through_the_verbs_seam():
    from gpunets import display, network

    assert verbs.get("fit") is network.fit and verbs.get("evaluate") is network.evaluate
    assert verbs.get("to_dot") is display.to_dot
    assert set(verbs.PROVIDERS) >= {"fit", "evaluate", "to_dot", "repr_html", "check_executor", "check_device"}


def test_a_provided_verb_is_the_one_nodes_and_machines_call(monkeypatch):
    calls = []
    monkeypatch.setitem(verbs._IMPL, "fit", lambda *a, **k: calls.append(a) or "fitted")
    X = gn.source(name="X")
    assert (X + 1).fit() == "fitted" and len(calls) == 1
    with pytest.raises(TypeError, match="Unknown gpunets verb"):
        verbs.provide(fitt=print)


def test_config_checks_values_through_the_seam():
    with pytest.raises(ValueError):
        gn.config(device="nonsense")
    with pytest.raises((ValueError, TypeError)):
        gn.config(executor="nonsense")


def test_the_import_contracts_hold():
    exe = pathlib.Path(sys.executable).with_name("lint-imports")
    if not exe.exists():
        pytest.skip("import-linter is not installed (pip install -e .[test])")
    out = subprocess.run([str(exe)], cwd=ROOT.parent, capture_output=True, text=True)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
