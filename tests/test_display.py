"""Notebook-friendly objects: Graphviz source, SVG (or None), HTML text trees, FitReport tables."""

from __future__ import annotations

import re
import shutil

import numpy as np
import pytest
from sklearn.linear_model import LinearRegression, Ridge
from sklearn.preprocessing import StandardScaler

import gpunets as gn


@pytest.fixture
def net():
    rng = np.random.default_rng(0)
    X = gn.source(rng.normal(size=(30, 3)), name="X")
    y = gn.source(rng.normal(size=30), name="y")
    scale = gn.machine(StandardScaler(), X)
    W = scale.transform(X)
    r1, r2 = gn.machine(Ridge(), W, y), gn.machine(Ridge(alpha=3.0), W, y)
    lr = gn.machine(LinearRegression(), W, y)
    out = gn.mean(r1.predict(W), r2.predict(W), lr.predict(W))
    return out, {"X": X, "y": y, "scale": scale, "r1": r1, "r2": r2, "lr": lr, "W": W}


def test_to_dot_is_graphviz_source(net):
    out, parts = net
    dot = out.to_dot()
    assert dot.startswith("digraph gpunets {") and dot.rstrip().endswith("}")
    assert dot.count("{") == dot.count("}")
    # sources as ellipses, machines with their (unique) labels, dashed training edges
    assert re.search(r'label="X", shape=ellipse', dot)
    assert re.search(r'label="y", shape=ellipse', dot)
    for label in ("StandardScaler", "Ridge", "Ridge#2", "LinearRegression"):
        assert f'"{label}"' in dot, label
    assert "style=dashed" in dot
    assert "->" in dot
    # every edge points at a declared node
    declared = set(re.findall(r"^\s*([nm]\d+) \[", dot, re.M))
    for a, b in re.findall(r"^\s*([nm]\d+) -> ([nm]\d+)", dot, re.M):
        assert a in declared and b in declared


def test_to_dot_quotes_names():
    s = gn.source(np.ones(2), name='we"ird\\name')
    dot = (s + 1).to_dot()
    assert 'we\\"ird\\\\name' in dot


def test_source_to_dot():
    s = gn.source(name="X")
    assert s.to_dot().splitlines()[0] == "digraph gpunets {"
    assert '"X"' in s.to_dot()


def test_repr_html_is_a_text_tree(net):
    out, _ = net
    html = out._repr_html_()
    assert html.startswith("<pre>") and html.endswith("</pre>")
    assert "X (source)" in html
    assert "predict[Ridge]" in html and "transform[StandardScaler]" in html
    assert "<script" not in html


def test_repr_html_escapes():
    s = gn.source(np.ones(2), name="<b>X</b>")
    html = (s * 2)._repr_html_()
    assert "<b>" not in html and "&lt;b&gt;X&lt;/b&gt;" in html


def test_repr_svg_is_svg_or_none(net, monkeypatch):
    out, _ = net
    svg = out._repr_svg_()
    if shutil.which("dot") is None:
        assert svg is None
    else:
        assert svg is not None and "<svg" in svg
    # without Graphviz: None, so that Jupyter falls back to the HTML tree
    monkeypatch.setattr(shutil, "which", lambda name: None)
    assert out._repr_svg_() is None


def test_repr_svg_with_a_fake_dot(net, monkeypatch, tmp_path):
    """Where `dot` is installed, its SVG output is what _repr_svg_ returns."""
    import os
    import sys

    out, _ = net
    fake = tmp_path / "dot"
    fake.write_text(f"#!{sys.executable}\nimport sys\nsys.stdin.read()\n"
                    "sys.stdout.write('<svg xmlns=\"http://www.w3.org/2000/svg\"></svg>')\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ.get('PATH', '')}")
    svg = out._repr_svg_()
    assert svg is not None and svg.startswith("<svg")


def test_repr_svg_none_when_dot_fails(net, monkeypatch, tmp_path):
    import os
    import sys

    out, _ = net
    fake = tmp_path / "dot"
    fake.write_text(f"#!{sys.executable}\nimport sys\nsys.exit(3)\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ.get('PATH', '')}")
    assert out._repr_svg_() is None


def test_fit_report_html_table(net):
    out, parts = net
    report = out.fit(executor="serial", device="cpu")   # the table's device column: the CPU in every lane
    html = report._repr_html_()
    assert html.startswith("<table>") and html.endswith("</table>")
    for col in ("machine", "action", "device", "lane", "ms"):
        assert f"<th>{col}</th>" in html
    rows = re.findall(r"<tr><td>(.*?)</td><td>(.*?)</td><td>(.*?)</td>", html)
    assert [r[0] for r in rows] == ["StandardScaler", "Ridge", "Ridge#2", "LinearRegression"]
    assert {r[1] for r in rows} == {"train"}
    assert {r[2] for r in rows} == {"cpu"}
    assert "serial" in html
    again = out.fit(executor="serial")._repr_html_()
    assert "<td>skip</td>" in again and "<td>train</td>" not in again


def test_fit_report_html_update(net):
    out, parts = net
    out.fit(executor="serial")
    parts["r2"].model.alpha = 7.0
    html = out.fit(executor="serial")._repr_html_()
    assert "<td>Ridge#2</td><td>update</td>" in html


def test_fit_report_repr_lists_machines(net):
    out, _ = net
    text = repr(out.fit(executor="serial"))
    assert text.startswith("FitReport (serial, 4 machines")
    for label in ("StandardScaler", "Ridge#2", "LinearRegression"):
        assert label in text


def test_machine_repr_html(net):
    out, parts = net
    html = parts["r1"]._repr_html_()
    assert "Ridge" in html and "not trained" in html
    out.fit(executor="serial", device="cpu")
    html = parts["r1"]._repr_html_()
    assert "trained (train, cpu, 30 rows)" in html
    assert "X (source)" in html


class _Averaged(gn.CompositeRegressor):
    def __init__(self, first=None, second=None, executor="serial"):
        self.first, self.second, self.executor = first, second, executor

    def network(self, X, y):
        a = gn.machine(self.first or Ridge(), X, y)
        b = gn.machine(self.second or LinearRegression(), X, y)
        return {"predict": gn.mean(a.predict(X), b.predict(X))}


def test_composite_shows_its_network_before_and_after_fit():
    model = _Averaged(first=Ridge(alpha=2.0))
    html = model._repr_html_()
    assert "network (not fitted; operations: predict)" in html
    assert "predict[Ridge]" in html or "<svg" in html
    assert "Ridge" in model.to_dot() and "LinearRegression" in model.to_dot()
    rng = np.random.default_rng(1)
    X = rng.normal(size=(40, 3))
    model.fit(X, X.sum(1))
    bundle = model._repr_mimebundle_()
    assert bundle["text/plain"] == repr(model)
    assert "network (fitted; operations: predict)" in bundle["text/html"]
    svg = model._repr_svg_()
    assert (svg is None) == (shutil.which("dot") is None)


def test_stacking_network_needs_data_to_be_drawn():
    stack = gn.StackingRegressor(estimators=[("r", Ridge()), ("l", LinearRegression())], cv=3)
    try:
        dot = stack.to_dot()   # a network that can be built without data draws before fit
    except ValueError as e:
        assert "fit the composite first" in str(e)
        assert "built at fit" in stack._repr_html_()
    else:
        assert dot.startswith("digraph")
    rng = np.random.default_rng(2)
    X = rng.normal(size=(40, 3))
    stack.fit(X, X.sum(1))
    assert stack.to_dot().startswith("digraph")
    html = stack._repr_html_()
    assert "network (fitted" in html
    assert "False" not in html.split("network (fitted")[1]   # constants are not drawn as graph nodes
