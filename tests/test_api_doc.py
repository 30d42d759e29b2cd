"""docs/api.md reads on a fresh clone: prose and one table line per public name, not only mkdocstrings
directives (issue 35 item 15)."""

from __future__ import annotations

import re
import types
from pathlib import Path

import gpunets as gn

API = Path(__file__).resolve().parents[1] / "docs" / "api.md"


def _public() -> set[str]:
    lazy = {n for n in dir(gn) if not n.startswith("_") and not isinstance(getattr(gn, n), types.ModuleType)}
    return (set(gn.__all__) | lazy) - {"Any", "annotations"}


def test_api_page_lists_every_public_name_with_a_line():
    text = API.read_text(encoding="utf-8")
    listed = dict(re.findall(r"^\| `gn\.(\w+)(?:\(\))?` \| (.+?) \|$", text, flags=re.M))
    assert _public() <= set(listed), sorted(_public() - set(listed))
    assert all(len(line) > 10 for line in listed.values())
    before_directives = text.split("\n::: ", 1)[0]
    prose = [p for p in before_directives.split("\n\n") if p and not p.startswith(("#", "|", ":::"))]
    assert sum(len(p) for p in prose) > 500   # paragraphs a reader can read without the site


def test_api_table_lines_start_with_the_docstrings_first_lines():
    text = API.read_text(encoding="utf-8")
    for name, line in re.findall(r"^\| `gn\.(\w+)(?:\(\))?` \| (.+?) \|$", text, flags=re.M):
        doc = (getattr(gn, name).__doc__ or "").strip().splitlines()[0]
        plain = re.sub(r":(?:func|class|mod|data|meth):`~?([^`]+)`", r"`\1`", doc).replace("``", "`")
        assert line.startswith(plain), (name, line, plain)   # a first sentence wrapped over lines: continued
