"""The fake-GPU lane runs the whole suite: the few host-only tests are marked with a reason and listed in
docs/testing.md (issue 23 item 19)."""

import ast
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent


def _marked() -> set[str]:
    """``file::test`` of every test carrying ``@pytest.mark.host_only(...)``."""
    out = set()
    for path in sorted((ROOT / "tests").rglob("test_*.py")):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("test_"):
                for dec in node.decorator_list:
                    if "host_only" in ast.unparse(dec):
                        out.add(f"{path.relative_to(ROOT).as_posix()}::{node.name}")
    return out


def _listed() -> set[str]:
    text = (ROOT / "docs" / "testing.md").read_text()
    block = re.search(r"<!-- host-only tests -->(.*?)<!-- /host-only tests -->", text, re.S)
    assert block, "docs/testing.md lost its list of host-only tests"
    return set(re.findall(r"`(tests/[^`]+::test_\w+)`", block.group(1)))


def test_the_docs_list_every_host_only_test_and_only_those():
    assert _listed() == _marked()


def _marked_long() -> set[str]:
    """``file::test`` of every test carrying ``@pytest.mark.long``."""
    out = set()
    for path in sorted((ROOT / "tests").rglob("test_*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("test_"):
                if any(ast.unparse(dec) == "pytest.mark.long" for dec in node.decorator_list):
                    out.add(f"{path.relative_to(ROOT).as_posix()}::{node.name}")
    return out


def test_the_docs_list_every_long_test_and_what_covers_it_in_the_quick_run():
    text = (ROOT / "docs" / "testing.md").read_text()
    block = re.search(r"<!-- long tests -->(.*?)<!-- /long tests -->", text, re.S)
    assert block, "docs/testing.md lost its list of long tests"
    assert set(re.findall(r"`(tests/[^`]+::test_\w+)`", block.group(1))) == _marked_long()


def test_the_ci_lane_runs_the_whole_suite_without_deselecting():
    ci = (ROOT / ".ci" / "run").read_text()
    lane = [line for line in ci.splitlines() if "GPUNETS_FAKE_GPU=1" in line or "$lane_env" in line]
    # the whole suite, the long runs included (-m ""), and the doctests of gpunets/ (a trailing comment allowed)
    assert any(re.search(r'pytest -q (-n \S+ )?-m "" tests gpunets\s*(#.*)?$', line) for line in lane), lane
    assert "--deselect" not in ci
    assert not any(" -k " in line for line in lane if "GPUNETS_FAKE_GPU=2" not in line)   # only the 2-GPU subset


def test_a_host_only_marker_needs_a_reason(pytester):
    pytester.makeconftest((ROOT / "tests" / "conftest.py").read_text())
    pytester.makepyfile(test_bare="""
        import pytest

        @pytest.mark.host_only
        def test_x():
            pass
    """)
    result = pytester.runpytest("-q")
    assert result.ret != 0
    assert "host_only needs a reason" in result.stdout.str() + result.stderr.str()


@pytest.mark.parametrize("lane, outcome", [("", "passed"), ("1", "skipped")])
def test_a_host_only_test_is_skipped_in_the_lane_with_its_reason(pytester, monkeypatch, lane, outcome):
    if lane:
        monkeypatch.setenv("GPUNETS_FAKE_GPU", lane)
    else:
        monkeypatch.delenv("GPUNETS_FAKE_GPU", raising=False)
    pytester.makeconftest((ROOT / "tests" / "conftest.py").read_text())
    pytester.makepyfile(test_marked="""
        import pytest

        @pytest.mark.host_only("sparse input: no GPU array holds it")
        def test_x():
            pass
    """)
    result = pytester.runpytest("-q", "-rs")
    result.assert_outcomes(**{outcome: 1})
    if lane:
        result.stdout.fnmatch_lines(["*host-only: sparse input: no GPU array holds it*"])
