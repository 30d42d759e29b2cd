"""``python -m gpunets demo``: the main job runs, agrees across modes, and rejects bad options in one line."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from gpunets.__main__ import build_network, main


def test_demo_runs_every_cpu_mode_and_they_agree(tmp_path, capsys):
    assert main(["demo", "--rows", "200", "--out", str(tmp_path), "--no-progress", "--repeat", "1"]) == 0
    out = capsys.readouterr().out
    for mode in ("CPU serial", "CPU threads", "CPU streams (emulated)"):
        assert mode in out
    rows = [line.split() for line in out.splitlines() if line.startswith("CPU ")]
    assert len(rows) == 3
    # "max |diff| vs CPU serial" column: every CPU mode gives the serial answers exactly
    diffs = [float(r[-2]) for r in rows]
    assert diffs == [0.0, 0.0, 0.0]
    trace = json.loads((tmp_path / "fastest_fit_trace.json").read_text())
    assert trace["traceEvents"]
    pytest.importorskip("matplotlib")
    assert (tmp_path / "fastest_fit_timeline.png").stat().st_size > 0


def test_demo_one_executor(tmp_path, capsys):
    assert main(["demo", "--rows", "150", "--executor", "threads", "--out", str(tmp_path), "--no-progress",
                 "--repeat", "1"]) == 0
    out = capsys.readouterr().out
    assert "CPU threads" in out and "CPU serial" in out   # serial is always the reference
    assert "streams" not in out.split("mode")[-1]


@pytest.mark.parametrize("argv, culprit", [
    (["--rows", "-5"], "--rows -5"),
    (["--rows", "10"], "--rows 10"),
    (["--executor", "foo"], "'foo'"),
    (["--device", "tpu"], "tpu"),
    (["--device", "cuda:7"], "cuda:7"),
    (["--repeat", "0"], "--repeat 0"),
])
def test_bad_options_are_one_line_and_exit_2(argv, culprit, tmp_path, capsys):
    from gpunets.devices.placement import Device, device_exists

    if argv[-1] == "cuda:7" and device_exists(Device.parse("cuda:7")):
        pytest.skip("this machine has a GPU 7")
    assert main(["demo", *argv, "--out", str(tmp_path / "out")]) == 2
    captured = capsys.readouterr()
    err = captured.err.strip()
    assert err.startswith("gpunets demo: error:") and "\n" not in err
    assert culprit in err
    assert captured.out == ""                      # failed before any work
    assert not (tmp_path / "out").exists()


def test_no_command_prints_help_and_exits_2(capsys):
    assert main([]) == 2
    assert "demo" in capsys.readouterr().out


def test_build_network_fits_and_predicts():
    from sklearn.datasets import make_friedman1

    X, y = make_friedman1(n_samples=150, n_features=10, random_state=1)
    out, parts = build_network(X, y)
    report = out.fit()
    assert set(report.actions.by_label()) == {"scale", "stack", "ridge", "knn", "forest", "extra"}
    pred = np.asarray(out(X[:7]))
    assert pred.shape == (7,)
    assert out.fit().actions.by_label() == dict.fromkeys(report.actions.by_label(), "skip")


def test_module_entry_point(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "gpunets", "demo", "--rows", "abc"], capture_output=True,
                          text=True, cwd=tmp_path, timeout=120)
    assert proc.returncode == 2
    assert "--rows" in proc.stderr


def test_demo_repeats_and_explains(tmp_path, capsys):
    from gpunets.devices.placement import gpu_available

    rows = []
    results = __import__("gpunets.__main__", fromlist=["demo"]).demo(
        rows=150, executor="streams", device="cpu", out_dir=str(tmp_path), progress=False, repeat=2)
    out = capsys.readouterr().out
    assert all(len(r["all_seconds"]) == 2 and r["seconds"] == min(r["all_seconds"]) for r in results)
    assert "best of 2" in out
    assert "emulated streams: " in out                       # one line that says what they are
    if not gpu_available():
        line = next(line for line in out.splitlines() if line.startswith("GPU:"))
        assert "none found" in line and ("CuPy" in line or "cupy" in line or "device" in line)
    assert rows == []


def test_demo_trace_holds_the_stacks_fold_fits(tmp_path, capsys):
    assert main(["demo", "--rows", "150", "--executor", "serial", "--device", "cpu", "--out", str(tmp_path),
                 "--no-progress", "--repeat", "1"]) == 0
    events = json.loads((tmp_path / "fastest_fit_trace.json").read_text())["traceEvents"]
    inner = [e for e in events if e.get("cat") == "fit" and e["args"].get("parent") == "stack"]
    assert len(inner) == 4 * (5 + 1) + 2          # 4 models x (5 folds + full refit) + final + the cv report
    assert "the 26 fits inside the stack" in capsys.readouterr().out


def test_progress_bar_counts_the_stacks_inner_fits(monkeypatch):
    from sklearn.datasets import make_friedman1

    from gpunets.api import network

    bars = []

    class Bar:
        def __init__(self, total, **kw):
            self.total, self.n = total, 0
            bars.append(self)

        def update(self, k):
            self.n += k

        def refresh(self):
            pass

        def close(self):
            pass

    monkeypatch.setattr(network, "tqdm_class", lambda: Bar)
    X, y = make_friedman1(n_samples=150, n_features=10, random_state=1)
    out, _ = build_network(X, y, executor="threads")
    out.fit(progress=True, executor="threads")
    assert len(bars) == 1                                   # one bar: the stack's fits count on it
    assert bars[0].total == bars[0].n == 6 + 26             # 6 machines + the stack's 26 fits (cv report included)


def test_progress_bar_is_the_text_bar_without_ipywidgets(monkeypatch):
    pytest.importorskip("tqdm")
    import importlib.util

    from gpunets.api.network import tqdm_class

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "ipywidgets" else real(name, *a))
    import tqdm.std

    assert tqdm_class() is tqdm.std.tqdm                    # no "IProgress not found" warning in a notebook


def test_version(capsys):
    from gpunets import __version__

    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0
    assert capsys.readouterr().out.strip() == f"gpunets {__version__}"
