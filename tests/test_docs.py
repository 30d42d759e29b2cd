"""Every ```python block of README.md and docs/*.md runs, and so does every example notebook.

* Each Markdown file's blocks run in order in one namespace (like a notebook), in a
  temporary working directory, with matplotlib's non-interactive backend.
* A block whose first line is ``# doctest: +SKIP-GPU`` needs a real GPU: it is skipped
  where none is present (or under numba's CUDA simulator) and runs unchanged where one is.
* Notebooks in docs/examples/ must be stored with their outputs cleared; they are executed
  with nbclient on the ``python3`` kernel, which jupyter_client starts with this very
  interpreter (``sys.executable``), so the venv's gpunets and ipykernel are the ones used.
* Where MkDocs and mkdocs-jupyter are installed (the ``docs`` extra), ``mkdocs build --strict`` must pass,
  and the example notebooks must appear on the site with their outputs (it executes them).
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
import textwrap
import traceback
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
MARKDOWN = [ROOT / "README.md", *sorted(DOCS.glob("*.md"))]
NOTEBOOKS = sorted((DOCS / "examples").glob("*.ipynb"))
SKIP_GPU = "# doctest: +SKIP-GPU"
# extras a page may use that a GPU workstation may lack (CI installs them): a block needing one that is missing
# skips the rest of its page, named (a missing module of any other name fails the page)
OPTIONAL = {"dask", "distributed", "dask_ml", "polars", "skops", "graphviz", "matplotlib", "cudf", "cuml"}

_FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})[ \t]*(?P<info>[^\n`]*)$")


def code_blocks(text: str) -> list[tuple[int, str, str]]:
    """``(first line number, info string, code)`` for every fenced block, in order."""
    blocks = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        indent, fence, info = m["indent"], m["fence"], m["info"].strip()
        body: list[str] = []
        j = i + 1
        while j < len(lines):
            close = lines[j].strip()
            if close.startswith(fence[0] * len(fence)) and set(close) <= {fence[0]}:
                break
            body.append(lines[j][len(indent):] if lines[j].startswith(indent) else lines[j])
            j += 1
        blocks.append((i + 2, info, textwrap.dedent("\n".join(body))))
        i = j + 1
    return blocks


def python_blocks(path: Path) -> list[tuple[int, str]]:
    out = []
    for line, info, code in code_blocks(path.read_text(encoding="utf-8")):
        lang = info.split()[0].lower() if info else ""
        lang = lang.lstrip("{.").rstrip("}")
        if lang in ("python", "py"):
            out.append((line, code))
    return out


def gpu_here() -> bool:
    if os.environ.get("NUMBA_ENABLE_CUDASIM", "0") == "1":
        return False
    from gpunets.devices.placement import gpu_available

    return gpu_available()


@pytest.fixture
def in_tmp(tmp_path, monkeypatch):
    """Run in a temporary directory with the Agg backend, and restore gpunets' settings after."""
    import gpunets as gn

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MPLBACKEND", "Agg")
    saved = gn.get_config()
    yield tmp_path
    gn.set_config(**saved)
    try:
        import matplotlib.pyplot as plt

        plt.close("all")
    except ImportError:  # pragma: no cover
        pass


def test_code_blocks_are_found():
    readme = python_blocks(ROOT / "README.md")
    assert len(readme) >= 3
    assert code_blocks("```python\nx = 1\n```\n\n  ```py\n  y = 2\n  ```\n") == [(2, "python", "x = 1"), (6, "py", "y = 2")]


@pytest.mark.parametrize("path", MARKDOWN, ids=[str(p.relative_to(ROOT)) for p in MARKDOWN])
def test_markdown_code_blocks_run(path: Path, in_tmp) -> None:
    blocks = python_blocks(path)
    if not blocks:
        return  # nothing to run
    namespace: dict = {"__name__": "__docs__"}
    gpu = None
    skipped = []
    for line, code in blocks:
        first = code.lstrip().splitlines()[0] if code.strip() else ""
        if first.strip().startswith(SKIP_GPU):
            gpu = gpu_here() if gpu is None else gpu
            if not gpu:
                skipped.append(line)
                continue
        try:
            exec(compile(code, f"{path.relative_to(ROOT)}:{line}", "exec"), namespace)  # noqa: S102
        except ModuleNotFoundError as exc:   # an optional extra not installed here (CI installs them all)
            top = (exc.name or "").split(".")[0]
            if top in OPTIONAL and importlib.util.find_spec(top) is None:
                pytest.skip(f"the python block at {path.relative_to(ROOT)} line {line} needs {top}, which is not "
                            f"installed here (pip install \"gpunets[test]\")")
            pytest.fail(f"the python block at {path.relative_to(ROOT)} line {line} failed:\n\n{code}\n\n"
                        f"{traceback.format_exc()}", pytrace=False)
        except Exception:  # noqa: BLE001 - re-raised with the block's place
            pytest.fail(f"the python block at {path.relative_to(ROOT)} line {line} failed:\n\n{code}\n\n"
                        f"{traceback.format_exc()}", pytrace=False)


def test_skip_marker_is_only_for_gpu_blocks():
    """The only way to skip a block is the GPU marker; it must sit on a block's first line."""
    for path in MARKDOWN:
        for line, code in python_blocks(path):
            lines = code.splitlines()
            for k, text in enumerate(lines):
                if "doctest:" in text and "+SKIP" in text:
                    assert k == 0 and text.strip() == SKIP_GPU, (
                        f"{path.name} block at line {line}: only '{SKIP_GPU}' on a block's first line may skip it")


# --- notebooks ----------------------------------------------------------------------------------

def test_there_are_example_notebooks():
    names = {p.name for p in NOTEBOOKS}
    assert {"first-network.ipynb", "gpu-vs-cpu-stacking.ipynb"} <= names


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_notebook_stored_without_outputs(path: Path) -> None:
    nbformat = pytest.importorskip("nbformat")
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    for i, cell in enumerate(nb.cells):
        if cell.cell_type == "code":
            assert cell.get("outputs", []) == [], f"{path.name} cell {i} is stored with outputs"
            assert cell.get("execution_count") is None, f"{path.name} cell {i} has an execution count"


@pytest.mark.long   # the docs build (test_mkdocs_build_strict, CI's docs step) executes them too
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_notebook_runs(path: Path, in_tmp) -> None:
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")
    nb = nbformat.read(path, as_version=4)
    # kernel "python3": jupyter_client replaces the spec's "python" with sys.executable, so the
    # kernel runs in this interpreter's environment (no kernelspec needs to be installed).
    client = nbclient.NotebookClient(nb, kernel_name="python3", timeout=300,
                                     resources={"metadata": {"path": str(in_tmp)}})
    client.execute()
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
              if o.get("output_type") == "error"]
    assert not errors


# --- the site -----------------------------------------------------------------------------------

def test_every_page_is_in_the_nav():
    text = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    for page in DOCS.glob("*.md"):
        assert re.search(rf":\s*{re.escape(page.name)}\s*$", text, re.M), f"docs/{page.name} is not in mkdocs.yml's nav"


@pytest.mark.long   # 40 s; CI's docs step builds the site too
def test_mkdocs_build_strict(tmp_path):
    pytest.importorskip("mkdocs")
    pytest.importorskip("mkdocstrings_handlers.python")
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
    env.pop("NUMBA_ENABLE_CUDASIM", None)
    pytest.importorskip("mkdocs_jupyter")
    site = tmp_path / "site"
    out = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
                         cwd=ROOT, capture_output=True, text=True, timeout=600, env=env)
    assert out.returncode == 0, out.stdout + out.stderr
    # the example notebooks are pages, rendered with their outputs: the graph (SVG), the report, the timeline
    first = (site / "examples" / "first-network" / "index.html").read_text(encoding="utf-8")
    assert "<caption>FitReport" in first                                       # the report's table
    assert first.count('data-mime-type="image/svg+xml"') >= 2                   # the graph and the timeline
    stacking = (site / "examples" / "gpu-vs-cpu-stacking" / "index.html").read_text(encoding="utf-8")
    assert "data:image/png" in stacking and "best of 3 warm runs" in stacking
