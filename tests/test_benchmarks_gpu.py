"""The GPU benchmark harness on the fake GPU: the executors' GPU section and ``benchmarks/gpu_check.sh --fake``.

On the fake GPU the times say nothing about a GPU: these tests check that the harness runs, that results equal
serial's, that the pictures are drawn and that no target is claimed. The timings themselves need a real GPU
(``bash benchmarks/gpu_check.sh`` there).
"""

from __future__ import annotations

import importlib.util
import json
import os
import pathlib
import subprocess
import sys

import pytest

import gpunets as gn
from gpunets.testing import fake_gpu

ROOT = pathlib.Path(__file__).resolve().parents[1]
HAS_MPL = importlib.util.find_spec("matplotlib") is not None


def test_executors_gpu_section_runs_both_workloads_on_the_fake_gpu(tmp_path):
    from benchmarks import bench_executors
    from benchmarks.run import targets

    with fake_gpu(1) as cp:
        res = bench_executors.gpu_streams(quick=True, png=str(tmp_path / "gpu.png"))
        assert cp.order_violations() == [] and cp.legacy_work() == []
    assert res["fake_gpu"] and "harness check only" in res["note"], res
    assert targets(res) == [], "the fake GPU claims no target"
    for workload in ("midsize", "gemm"):
        r = res[workload]
        assert r["branches"] == 8 and r["workers"] == 8 and r["repeats"] == 3, r
        assert set(r["seconds"]) == {"serial", "streams"} and min(r["seconds"].values()) > 0, r
        assert r["max_abs_diff_vs_serial"] == 0.0, r   # the fake computes with NumPy: equal to the bit
        assert set(r["speedup_streams"]) == {"value", "note"}, r
        assert r["trace_overlap"] is not None and r["trace_overlap"] > 0, r   # timing: its value means nothing here
        if HAS_MPL:
            assert r["timeline_png"] == str(tmp_path / f"gpu_{workload}.png")
            assert (tmp_path / f"gpu_{workload}.png").stat().st_size > 1000
    assert res["midsize"]["kernels_per_branch"] == 5 * res["midsize"]["steps"] + 3


def test_executors_gpu_section_claims_its_targets_on_a_real_gpu_only(monkeypatch):
    """Off the fake GPU the ratio is a verdict: {"value", "target", "met"} (mid-size: >= 1.5 on a GPU)."""
    import types

    import numpy as np

    from benchmarks import bench_executors

    device = types.SimpleNamespace(synchronize=lambda: None)
    cp = types.SimpleNamespace(asnumpy=np.asarray, cuda=types.SimpleNamespace(Device=lambda: device))
    monkeypatch.setattr(bench_executors.gn, "evaluate",
                        lambda *a, **k: types.SimpleNamespace(trace=types.SimpleNamespace(records=[])))
    res = bench_executors.streams_vs_serial(cp, lambda executor, output: np.ones(3), workers=8, repeats=1,
                                            png=None, title="t", target=">= 1.5 on a GPU", threshold=1.5,
                                            fake=False)
    sp = res["speedup_streams"]
    assert set(sp) == {"value", "target", "met"} and sp["target"] == ">= 1.5 on a GPU"
    assert sp["met"] == (sp["value"] >= 1.5) and res["max_abs_diff_vs_serial"] == 0.0


def test_graphs_section_on_the_fake_gpu_claims_nothing_and_equals_eager():
    from benchmarks import bench_graphs
    from benchmarks.run import targets

    with fake_gpu(1) as cp:
        res = bench_graphs.graphs_section(quick=True)
        assert cp.order_violations() == []
    assert res["fake_gpu"] and "error" not in res and targets(res) == [], res
    for part in ("replay", "streams", "predict"):
        assert res[part]["bitwise_equal"] and min(res[part]["seconds"].values()) > 0, res[part]
    assert res["replay"]["report"][0].startswith("graphs: replayed 1 segment(s)"), res["replay"]["report"]
    assert "eager predict(Ridge" in "\n".join(res["predict"]["report"])
    line = bench_graphs.summary(res)
    assert line.startswith("replay/eager ") and line.endswith("[fake GPU: harness check only]"), line
    h200 = {"replay": {"speedup_replay": {"value": 9.1, "target": ">= 8.0 (replay ...)", "met": True}},
            "streams": {"speedup_streams": {"value": 1.2, "target": ">= 1.5 (...)", "met": False}},
            "predict": {"ratio_graphs_vs_eager": {"value": 0.2, "target": "<= 0.25 (...)", "met": True}}}
    assert bench_graphs.summary(h200) == ("replay/eager 9.10x (target >= 8.0: met), 8 streams/1 stream 1.20x "
                                          "(target >= 1.5: NOT met), predict graphs/eager 0.20x (target <= 0.25: "
                                          "met)")


def test_gpu_check_summary_lines(tmp_path):
    from benchmarks import gpu_check_tools as tools

    path = tmp_path / "gpu_check.json"
    path.write_text(json.dumps({
        "environment": {"gpu": "NVIDIA H200", "cupy": "14.0.1", "numba_cuda": "0.30.4",
                        "nvvm_probe": "ok: compile_ptx for sm_90", "absent": ["cudf", "cuml", "dask"]},
        "executors_gpu": {"midsize": {"speedup_streams": {"value": 2.31, "target": ">= 1.5 on a GPU (mid-size)",
                                                          "met": True}},
                          "gemm": {"speedup_streams": {"value": 1.02, "target": ">= 0.9 (saturating)", "met": True}}},
        "gpu_tests_legacy_stream": {"tests": 40, "failures": 1, "errors": 0, "skipped": 3, "failed": ["t::a"],
                                    "error": "pytest exited with 1 (124: the timeout; 5: no GPU test collected)"},
        "gpu_tests_per_thread_stream": {"tests": 40, "failures": 0, "errors": 0, "skipped": 3},
        "multi_gpu_dask": {"skipped": "1 GPU(s): the multi-GPU section needs 2 or more real ones"},
        "host_cost": {"host_us_per_gpu_task": {"value": 4.4, "target": "<= 10.0 us (fake GPU included)", "met": True},
                      "fan_in_4000_over_400": {"value": 1.7, "target": "<= 1.5", "met": False}},
    }))
    assert tools.summary(str(path), "host_cost") == (
        "[host_cost] ok: 4.4 us of gpunets' host time per GPU task (target <= 10.0 us: met), "
        "fan-in 4000/400 per task 1.70x (target <= 1.5: NOT met)")
    assert tools.summary(str(path), "environment") == (
        "[environment] ok: NVIDIA H200, CuPy 14.0.1, numba-cuda 0.30.4, NVVM ok, without cudf, cuml, dask")
    assert tools.summary(str(path), "executors_gpu") == (
        "[executors_gpu] ok: midsize streams/serial 2.31x (target >= 1.5 on a GPU: met), "
        "gemm 1.02x (target >= 0.9: met)")
    assert tools.summary(str(path), "gpu_tests_legacy_stream").startswith("[gpu_tests_legacy_stream] FAILED: pytest")
    assert tools.summary(str(path), "gpu_tests_per_thread_stream") == (
        "[gpu_tests_per_thread_stream] ok: 37 passed, 0 failed, 3 skipped")
    assert tools.summary(str(path), "multi_gpu_dask").startswith("[multi_gpu_dask] skipped: 1 GPU(s)")
    assert tools.summary(str(path), "kernels_gpu") == "[kernels_gpu] FAILED: no result"


def test_gpu_check_lines_seen_on_an_h200(tmp_path):
    """What the first real-GPU runs showed the summary lines must say: a numeric target (the kernels' 0.75), a
    numba-cuda that cannot run with the NumPy installed, and the failed tests of a test run, by name."""
    from benchmarks import gpu_check_tools as tools

    xml = tmp_path / "t.xml"
    xml.write_text('<testsuites><testsuite tests="3" failures="1" errors="0" skipped="1">'
                   '<testcase classname="tests.test_a" name="ok"/>'
                   '<testcase classname="tests.test_a" name="bad[x]"><failure message="m"/></testcase>'
                   '<testcase classname="tests.test_b" name="s"><skipped message="needs two GPUs"/></testcase>'
                   '</testsuite></testsuites>')
    run = tools.junit(str(xml), 1, "CUPY_CUDA_PER_THREAD_DEFAULT_STREAM=1")
    assert run["failed"] == ["tests.test_a::bad[x]"] and run["skipped_because"] == ["needs two GPUs"]
    assert run["error"].startswith("pytest exited with 1: 1 failed (tests.test_a::bad[x])")
    suite = tools.junit(str(xml), 0, "whole suite", suite=True)
    assert "error" not in suite and "note" not in suite
    path = tmp_path / "gpu_check.json"
    path.write_text(json.dumps({
        "kernels_gpu": {"bandwidth_GBps": {"gpunets_mean": 2239.0},
                        "ratios": {"bandwidth_vs_copy": {"value": 0.543, "target": 0.75, "met": False}}},
        "environment": {"error": "numba-cuda cannot compile kernels here: numba-cuda 0.30.4 cannot compile CUDA "
                                 "kernels with NumPy 2.5.2 and numba 0.68.0: ..."},
        "whole_suite": {"tests": 3, "failures": 0, "errors": 0, "skipped": 1, "env": "whole suite, xdist -n 14"},
    }))
    assert tools.summary(str(path), "kernels_gpu") == (
        "[kernels_gpu] ok: mean at 2239.0 GB/s, 0.54x of a copy's bandwidth (target >= 0.75: NOT met)")
    assert tools.summary(str(path), "environment").startswith(
        "[environment] FAILED: numba-cuda cannot compile kernels here: numba-cuda 0.30.4 cannot compile")
    assert tools.summary(str(path), "whole_suite") == (
        "[whole_suite] ok: 2 passed, 0 failed, 1 skipped (whole suite, xdist -n 14)")


@pytest.mark.parametrize("layout", ["cuda12-wheel", "cuda13-wheel", "toolkit"])
def test_find_nvvm_in_cuda_12_and_13_layouts_without_pathfinder(tmp_path, monkeypatch, layout):
    from benchmarks import gpu_check_tools as tools

    rel = {"cuda12-wheel": "site/nvidia/cuda_nvcc/nvvm/lib64/libnvvm.so",
           "cuda13-wheel": "site/nvidia/cu13/lib/libnvvm.so.4",
           "toolkit": "cuda-13.0/nvvm/lib64/libnvvm.so.4.0.0"}[layout]
    lib = tmp_path / rel
    lib.parent.mkdir(parents=True)
    lib.write_bytes(b"")
    roots = [str(tmp_path / "none"), str(tmp_path / "cuda-13.0"), str(tmp_path / "site/nvidia/cuda_nvcc"),
             str(tmp_path / "site/nvidia/cu13")]
    monkeypatch.setitem(sys.modules, "cuda.pathfinder", None)   # an image without cuda-pathfinder
    monkeypatch.delenv("CUDA_HOME", raising=False)
    info = tools.find_nvvm(roots=roots)
    assert info["pathfinder"] == "not installed"
    assert info["nvvm"] == str(lib) and info["export_cuda_home"] == str(lib.parents[2 if "/nvvm/" in rel else 1])
    info = tools.find_nvvm(roots=[str(tmp_path / "none")])
    assert info["nvvm"] is None and info["tried"] == [str(tmp_path / "none")]


def test_find_nvvm_prefers_cuda_pathfinder():
    pytest.importorskip("cuda.pathfinder")
    from benchmarks import gpu_check_tools as tools

    info = tools.find_nvvm(roots=[])
    if info.get("nvvm") is None:
        pytest.skip(f"no libNVVM here for cuda.pathfinder to find: {info.get('pathfinder')}")
    assert info["found_by"].startswith("cuda.pathfinder") and info["export_cuda_home"] is None
    assert os.path.basename(info["nvvm"]).startswith("libnvvm")


# An image with CuPy and numba-cuda but neither RAPIDS nor Dask: these imports fail in every Python process the
# script starts (a sitecustomize on PYTHONPATH), as where the packages are not installed.
HIDE = ("dask", "distributed", "dask_cuda", "dask_ml", "cudf", "cuml", "rmm")
SITECUSTOMIZE = f"import sys\nfor _n in {HIDE!r}:\n    sys.modules[_n] = None\n"


@pytest.mark.slow   # 45-75 s on 2 shared cores
@pytest.mark.long   # the sections it runs have their own fast tests above; CI and the lane still run it
def test_gpu_check_script_in_fake_mode_without_rapids_or_dask(tmp_path):
    """``bash benchmarks/gpu_check.sh --fake`` runs every section on the CPU: one line each, all ok, the JSON."""
    hide = tmp_path / "hide"
    hide.mkdir()
    (hide / "sitecustomize.py").write_text(SITECUSTOMIZE)
    out = tmp_path / "out"
    env = {**os.environ, "PYTHON": sys.executable, "PYTHONPATH": str(hide)}
    for var in ("GPUNETS_FAKE_GPU", "GPU_CHECK_FAKE", "CUDA_HOME"):
        env.pop(var, None)
    proc = subprocess.run(["bash", "benchmarks/gpu_check.sh", "--fake", str(out)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    sections = ["environment", "warm", "gpu_tests_legacy_stream", "gpu_tests_per_thread_stream", "host_cost",
                "executors_gpu", "kernels_gpu", "tuning_gpu", "tuning_gpu_batch", "gpu_vs_cpu", "graphs", "multi_gpu_dask"]
    lines = [line for line in proc.stdout.splitlines() if line.startswith("[")]
    assert [line.split("]")[0][1:] for line in lines] == sections, proc.stdout
    assert all(" ok: " in line for line in lines[:-1]) and "skipped: 1 GPU(s)" in lines[-1], proc.stdout
    assert "gpu_check: PASSED (fake GPU" in proc.stdout.splitlines()[-1]
    res = json.loads((out / "gpu_check.json").read_text())
    assert set(sections) <= set(res) and not [k for k, v in res.items() if isinstance(v, dict) and "error" in v]
    assert set(HIDE[:2]) | {"cudf", "cuml"} <= set(res["environment"]["absent"]), res["environment"]
    assert res["gpu_tests_per_thread_stream"]["skipped"] == res["gpu_tests_per_thread_stream"]["tests"] > 0
    assert "could not import 'distributed'" in (out / "gpu_tests_legacy_stream.log").read_text()  # skipped cleanly
    assert "crossover_rows" not in res["gpu_vs_cpu"] and res["gpu_vs_cpu"]["fake_gpu"]
    assert set(res["gpu_vs_cpu"]["warm"]) == {"gpu_part/float64", "search/float64"}
    assert "error" not in res["gpu_vs_cpu"]["cold"]["gpu_part/gpu_streams"], res["gpu_vs_cpu"]["cold"]
    assert "host per launch dispatcher" in lines[6] and "[fake GPU: harness check only]" in lines[9], lines
    assert "us of gpunets' host time per GPU task" in lines[4] and "fan-in 4000/400" in lines[4], lines
    assert "search batched/unbatched" in lines[8] and "target" not in lines[8].split(",")[0], lines   # no speed claim
    assert "replay/eager" in lines[10] and "predict graphs/eager" in lines[10] and "target" not in lines[10], lines
    for workload in ("midsize", "gemm"):
        assert res["executors_gpu"][workload]["max_abs_diff_vs_serial"] == 0.0
        assert "target" not in res["executors_gpu"][workload]["speedup_streams"]
        if HAS_MPL:
            assert (out / f"executors_gpu_timeline_{workload}.png").exists()


# ---- issue 36: the kernels' GPU section (kernel alone, host per launch) and gpu_vs_cpu ------------------------------

def test_kernels_gpu_section_times_the_kernel_and_the_host_apart_on_the_fake_gpu():
    from benchmarks import bench_kernels
    from benchmarks.run import targets

    with fake_gpu(1) as cp:
        res = bench_kernels.gpu_section(quick=True)
        assert cp.order_violations() == [] and cp.legacy_work() == []
    assert res["fake_gpu"] and targets(res) == [], "the fake GPU claims no target"
    assert res["launches_per_window"] == 2 and res["best_seconds"]["gpunets_mean"] > 0
    host = res["host"]
    assert set(host["host_us_per_launch"]) == {"dispatcher"}, host   # the simulator launches through numba only
    assert "paths_bitwise_equal" not in host and "error" not in res
    assert set(res["ratios"]) == {"bandwidth_vs_copy", "host_us_per_launch"}
    assert all("note" in v for v in res["ratios"].values())


def test_gpu_vs_cpu_runs_every_mode_on_the_fake_gpu_without_claiming_a_crossover(tmp_path):
    from benchmarks import bench_gpu_vs_cpu as b
    from benchmarks.run import targets

    with fake_gpu(1) as cp:
        res = b.run(quick=True, rows=(120,), workloads=("gpu_part",), dtypes=("float32",), with_cold=False,
                    repeat=1, png=str(tmp_path / "p.png"))
        assert cp.order_violations() == []
    assert res["fake_gpu"] and not res["real_gpu"] and "error" not in res, res
    assert targets(res) == [] and "crossover_rows" not in res and "plot" not in res
    assert "harness check only" in res["note"] and not (tmp_path / "p.png").exists()
    cell = res["warm"]["gpu_part/float32"]["120"]
    assert list(cell) == ["cpu_serial", "cpu_best", "gpu_auto", "gpu_streams"]
    assert cell["cpu_serial"]["routes"] == {"sklearn@cpu": 3}
    gpu = cell["gpu_streams"]["routes"]
    assert sum(gpu.values()) == 3 and set(gpu) <= {"array_api@cuda:0", "cpu_fallback@cpu"}, gpu
    assert all(c["seconds"] > 0 and c["max_abs_diff_vs_cpu_serial"] < 1e-3 for c in cell.values()), cell
    assert b.one_line(res).startswith("1 cells run on cpu_serial, cpu_best, gpu_auto, gpu_streams")


def test_gpu_vs_cpu_crossover_table_and_plot_from_measured_cells(tmp_path):
    """On a real GPU the section's headline: the first row count where a GPU mode beats CPU best, per workload."""
    from benchmarks import bench_gpu_vs_cpu as b

    def cell(cpu_best, gpu_auto, gpu_streams):
        return {"cpu_serial": {"seconds": 9.0}, "cpu_best": {"seconds": cpu_best},
                "gpu_auto": {"seconds": gpu_auto}, "gpu_streams": {"seconds": gpu_streams}}

    cells = {"gpu_part/float64": {"10000": cell(0.1, 0.3, 0.4), "100000": cell(1.0, 0.5, 0.9),
                                  "1000000": cell(10.0, 1.0, 2.0)},
             "gpu_part/float32": {"10000": cell(0.1, 0.3, 0.4), "100000": cell(0.5, 0.6, 0.7),
                                  "1000000": cell(5.0, 1.0, 0.9)},
             "network/float64": {"10000": cell(1.0, 2.0, 3.0), "100000": {"skipped": "estimated 900 s"}}}
    cross = b.crossover(cells, b.ROWS)
    assert cross == {"gpu_part/float64": 100_000, "gpu_part/float32": 1_000_000, "network/float64": None}
    upto = b.measured_up_to(cells)
    assert upto == {"gpu_part/float64": 1_000_000, "gpu_part/float32": 1_000_000, "network/float64": 10_000}
    table = b.crossover_table(cross, upto)
    assert table == {"StandardScaler": 1_000_000, "PCA": 1_000_000, "Ridge": 1_000_000}
    with gn.config(gpu_crossover=table):   # what device="auto" reads (gpunets.planning.crossover)
        assert gn.get_config()["gpu_crossover"] == table
    # the GPU never won up to the largest size measured: kept beyond it, nothing claimed where nothing was measured
    never = b.crossover_table({"gpu_part/float64": 10_000, "gpu_part/float32": None},
                              {"gpu_part/float64": 1_000_000, "gpu_part/float32": 100_000})
    assert never == dict.fromkeys(("StandardScaler", "PCA", "Ridge"), 100_001)
    assert b.crossover_table({"search/float64": 10_000}, {"search/float64": 10_000}) == {}   # no gpu_part: no table
    line = b.one_line({"real_gpu": True, "crossover_rows": cross})
    assert line == ("GPU beats CPU best from: gpu_part/float64 100,000 rows, gpu_part/float32 1,000,000 rows, "
                    "network/float64 never")
    if HAS_MPL:
        path = b.plot(cells, b.ROWS, str(tmp_path / "img" / "gpu_vs_cpu.png"), "t")
        assert path and os.path.getsize(path) > 1000


@pytest.mark.slow   # a fresh Python process per mode
def test_gpu_vs_cpu_cold_runs_each_mode_in_a_fresh_process():
    from benchmarks import bench_gpu_vs_cpu as b

    res = b.cold(["gpu_part"], ["cpu_serial"], 200, "float64", timeout=300)
    r = res["gpu_part/cpu_serial"]
    assert "error" not in r, r
    assert r["first_seconds"] >= r["second_seconds"] > 0 or r["one_off_seconds"] == 0
    assert r["import_seconds"] > 0 and r["one_off_seconds"] >= 0


def test_gpu_check_lines_for_the_kernels_host_and_gpu_vs_cpu(tmp_path):
    from benchmarks import gpu_check_tools as tools

    path = tmp_path / "gpu_check.json"
    path.write_text(json.dumps({
        "kernels_gpu": {"bandwidth_GBps": {"gpunets_mean": 3500.0},
                        "host": {"host_us_per_launch": {"cached": 21.5, "dispatcher": 412.0},
                                 "paths_bitwise_equal": True},
                        "ratios": {"bandwidth_vs_copy": {"value": 0.85, "target": 0.8, "met": True},
                                   "host_us_per_launch": {"value": 21.5, "target": "<= 30.0 us (cached path)",
                                                          "met": True}}},
        "gpu_vs_cpu": {"real_gpu": True, "crossover_rows": {"gpu_part/float64": 100_000, "search/float64": None},
                       "crossover_table": {"Ridge": 100_000}},
        "gpu_vs_cpu_fake": {"fake_gpu": True, "warm": {"a/f": {"1": {}}}, "modes": ["cpu_serial"],
                            "note": "harness check only: fake GPU"},
    }))
    assert tools.summary(str(path), "kernels_gpu") == (
        "[kernels_gpu] ok: mean at 3500.0 GB/s, 0.85x of a copy's bandwidth (target >= 0.8: met); "
        "host per launch cached 21.5 us, dispatcher 412.0 us (target <= 30.0 us: met)")
    assert tools.summary(str(path), "gpu_vs_cpu") == (
        "[gpu_vs_cpu] ok: GPU beats CPU best from: gpu_part/float64 100,000 rows, search/float64 never; "
        "table {'Ridge': 100000}")
    assert tools.describe("gpu_vs_cpu", json.loads(path.read_text())["gpu_vs_cpu_fake"]).startswith(
        "1 cells run on cpu_serial")
