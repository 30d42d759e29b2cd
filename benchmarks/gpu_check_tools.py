"""Helpers of ``benchmarks/gpu_check.sh``: find NVVM, merge a section into the JSON file, one summary line.

    python benchmarks/gpu_check_tools.py nvvm                  # JSON: where libNVVM is, CUDA_HOME to export
    python benchmarks/gpu_check_tools.py save FILE SECTION     # merge the JSON object on stdin under SECTION
    python benchmarks/gpu_check_tools.py summary FILE SECTION  # "[SECTION] ok: ..." from FILE's SECTION
    python benchmarks/gpu_check_tools.py failed FILE           # the sections with an error; exit 1 if any
    python benchmarks/gpu_check_tools.py junit XML RC ENV [--suite]   # JSON: a pytest run's counts and failures

NVVM (numba-cuda compiles kernels through it) is looked for as numba-cuda itself does, newest first:

1. ``cuda.pathfinder`` when it is importable (numba-cuda 0.20+ depends on it): NVIDIA's pip wheels, for
   CUDA 13 ``site-packages/nvidia/cu13/lib/libnvvm.so.4`` (libdevice in ``nvidia/cu13/nvvm/libdevice`` or
   ``nvidia/cuda_nvvm/nvvm/libdevice``), for CUDA 12 ``site-packages/nvidia/cuda_nvcc/nvvm/lib64``; then the
   system loader (conda, ``/etc/ld.so.conf.d``); then ``CUDA_HOME``/``CUDA_PATH``. Nothing needs exporting.
2. Otherwise a toolkit root for ``CUDA_HOME``: ``/usr/local/cuda``, ``/usr/local/cuda-13*``, ``/usr/local/cuda-12*``
   (newest first), the CUDA 12 wheel's ``nvidia/cuda_nvcc``, the CUDA 13 wheel's ``nvidia/cu13``.

A ``CUDA_HOME`` already set is kept. Whether NVVM really works is the environment probe's job (one
``compile_ptx``), run after this.
"""

from __future__ import annotations

import glob
import importlib
import json
import os
import site
import sys
import time
from typing import Any


def _site_dirs() -> list[str]:
    dirs = []
    try:
        dirs += site.getsitepackages()
    except AttributeError:  # pragma: no cover - some virtualenvs
        pass
    try:
        dirs.append(site.getusersitepackages())
    except AttributeError:  # pragma: no cover
        pass
    dirs += [p for p in sys.path if p.endswith("-packages")]
    return list(dict.fromkeys(d for d in dirs if os.path.isdir(d)))


def _has_nvvm(root: str) -> str | None:
    """The libnvvm under a toolkit root (``nvvm/lib64`` for a toolkit or CUDA 12's wheel, ``lib`` for CUDA 13's)."""
    for pattern in ("nvvm/lib64/libnvvm.so*", "lib/libnvvm.so*"):
        hits = sorted(glob.glob(os.path.join(root, pattern)))
        if hits:
            return hits[0]
    return None


def toolkit_candidates() -> list[str]:
    """Roots that may hold libNVVM, in the order they are tried for ``CUDA_HOME``."""
    roots = ["/usr/local/cuda"]
    roots += sorted(glob.glob("/usr/local/cuda-13*"), reverse=True)
    roots += sorted(glob.glob("/usr/local/cuda-12*"), reverse=True)
    for d in _site_dirs():
        roots += [os.path.join(d, "nvidia", "cuda_nvcc"), os.path.join(d, "nvidia", "cu13")]
    return roots


def find_nvvm(roots: list[str] | None = None) -> dict[str, Any]:
    """Where libNVVM is and how it was found; ``export_cuda_home`` is what the script should export (or None).

    ``roots`` replaces :func:`toolkit_candidates` (for tests).
    """
    info: dict[str, Any] = {"CUDA_HOME": os.environ.get("CUDA_HOME"), "export_cuda_home": None}
    try:
        pathfinder = importlib.import_module("cuda.pathfinder")
    except ImportError:
        info["pathfinder"] = "not installed"
    else:
        try:
            lib = pathfinder.load_nvidia_dynamic_lib("nvvm")
            info.update(nvvm=lib.abs_path, found_by=f"cuda.pathfinder {getattr(pathfinder, '__version__', '')}"
                        f" ({getattr(lib, 'found_via', None) or 'found'})".replace("  ", " "))
            return info
        except Exception as e:  # noqa: BLE001 - DynamicLibNotFoundError, or a loader error: try the roots
            info["pathfinder"] = f"no libnvvm: {str(e).splitlines()[0][:200] if str(e) else type(e).__name__}"
    if info["CUDA_HOME"]:
        info.update(nvvm=_has_nvvm(info["CUDA_HOME"]), found_by="CUDA_HOME (already set)")
        return info
    tried = []
    for root in toolkit_candidates() if roots is None else roots:
        tried.append(root)
        lib = _has_nvvm(root) if os.path.isdir(root) else None
        if lib:
            info.update(nvvm=lib, found_by=f"toolkit root {root}", export_cuda_home=root)
            return info
    info.update(nvvm=None, found_by=None, tried=tried)
    return info


def save(path: str, key: str, raw: str) -> None:
    """Merge the JSON object ``raw`` into the file under ``key`` (the file is complete after each call)."""
    try:
        with open(path) as f:
            res = json.load(f)
    except (OSError, ValueError):
        res = {}
    try:
        res[key] = json.loads(raw)
    except ValueError:
        res[key] = {"error": "unreadable section output", "raw": raw[-2000:]}
    res["updated"] = time.strftime("%Y-%m-%d %H:%M:%S")
    with open(path, "w") as f:
        json.dump(res, f, indent=2, default=str)


def _x(v: Any) -> str:
    return f"{v:.2f}x" if isinstance(v, (int, float)) else "?"


def _target(entry: Any) -> str:
    """' (target >= 1.5: met)', or the fake GPU's note, or ''."""
    if not isinstance(entry, dict):
        return ""
    if "target" in entry:
        target = entry["target"]
        target = target.split(" (")[0] if isinstance(target, str) else f">= {target}"   # "0.75": a bare number
        return f" (target {target}: {'met' if entry.get('met') else 'NOT met'})"
    return ""


def _tests(r: dict[str, Any]) -> str:
    n, skipped = r.get("tests", 0), r.get("skipped", 0)
    bad = r.get("failures", 0) + r.get("errors", 0)
    text = f"{n - skipped - bad} passed, {bad} failed, {skipped} skipped"
    if r.get("failed"):
        text += f" ({', '.join(r['failed'][:3])}{', ...' if len(r['failed']) > 3 else ''})"
    return text


def describe(section: str, r: dict[str, Any]) -> str:
    """What one section found, in a few words (after 'ok: ')."""
    fake = " [fake GPU: harness check only]" if r.get("fake_gpu") else ""
    if section == "environment":
        probe = str(r.get("nvvm_probe", "?"))
        parts = [str(r.get("gpu", "?")), f"CuPy {r.get('cupy', '?')}"]
        if r.get("numpy"):
            parts.append(f"NumPy {r['numpy']}")
        parts += [f"numba-cuda {r.get('numba_cuda', '?')}" + (" (simulator)" if r.get("simulator") else ""),
                  "NVVM ok" if probe.startswith("ok") else f"NVVM {probe}"]
        if r.get("absent"):
            parts.append("without " + ", ".join(r["absent"]))
        return ", ".join(parts)
    if section == "warm":
        return (f"{r.get('ptx', '?')}; CuPy and combine kernels warmed in {r.get('warm_seconds', '?')} s"
                f"{fake}")
    if section.startswith("gpu_tests"):
        return _tests(r) + (f" ({r['note']})" if r.get("note") else "")
    if section == "host_cost":
        per, fan = r.get("host_us_per_gpu_task", {}), r.get("fan_in_4000_over_400", {})
        value = per.get("value")
        text = f"{value:.1f} us of gpunets' host time per GPU task" if isinstance(value, float) else "? us per task"
        return f"{text}{_target(per)}, fan-in 4000/400 per task {_x(fan.get('value'))}{_target(fan)}"
    if section == "executors_gpu":
        mid, gemm = r.get("midsize", {}), r.get("gemm", {})
        ms, gs = mid.get("speedup_streams", {}), gemm.get("speedup_streams", {})
        return (f"midsize streams/serial {_x(ms.get('value'))}{_target(ms)}, "
                f"gemm {_x(gs.get('value'))}{_target(gs)}{fake}")
    if section == "kernels_gpu":
        bw = r.get("bandwidth_GBps", {}).get("gpunets_mean", "?")
        ratio = r.get("ratios", {}).get("bandwidth_vs_copy", {})
        text = f"mean at {bw} GB/s, {_x(ratio.get('value'))} of a copy's bandwidth{_target(ratio)}"
        host = r.get("host", {}).get("host_us_per_launch", {})
        if host:
            per = ", ".join(f"{path} {us:.1f} us" for path, us in host.items())
            text += f"; host per launch {per}{_target(r.get('ratios', {}).get('host_us_per_launch'))}"
            if r["host"].get("paths_bitwise_equal") is False:
                text += "; the launch paths DIFFER"
        return text + fake
    if section == "gpu_vs_cpu":
        from benchmarks.bench_gpu_vs_cpu import one_line  # the section's own headline

        text = one_line(r)
        if r.get("real_gpu") and r.get("crossover_table"):
            text += f"; table {r['crossover_table']}"
        return text + fake
    if section == "graphs":
        from benchmarks.bench_graphs import summary as graphs_summary  # the section's own headline

        return graphs_summary(r)
    if section == "tuning_gpu":
        ratio = r.get("ratio_streams_vs_serial", {}).get("value")
        sp = 1 / ratio if isinstance(ratio, (int, float)) and ratio > 0 else None
        eq = r.get("scores_equal_cpu", {})
        return (f"search streams/serial {_x(sp)}, scores vs CPU max diff {eq.get('value', '?'):.1e}"
                if isinstance(eq.get("value"), float) else f"search streams/serial {_x(sp)}") + fake
    if section == "tuning_gpu_batch":
        ratio = r.get("ratio_batched_vs_unbatched", {})
        eq = r.get("scores_equal_cpu", {})
        diff = eq.get("value")
        diff_text = f"{diff:.1e}" if isinstance(diff, float) else "?"
        return (f"search batched/unbatched {_x(ratio.get('value'))}{_target(ratio)}"
                f"{_target(r.get('ratio_vs_before')) if r.get('ratio_vs_before') else ''}, "
                f"scores vs CPU max rel diff {diff_text}{_target(eq)}") + fake
    if section == "whole_suite":
        return _tests(r) + f" ({r.get('env')})"
    if section == "multi_gpu_dask":
        return f"{r.get('gpus')} GPUs, pytest exit code {r.get('pytest_exit_code')}"
    return ", ".join(f"{k}={v}" for k, v in r.items() if not isinstance(v, (dict, list)))[:200]


def summary(path: str, section: str) -> str:
    """The one line the script prints for ``section``: ``[section] ok|skipped|FAILED: ...``."""
    try:
        with open(path) as f:
            r = json.load(f).get(section)
    except (OSError, ValueError) as e:
        return f"[{section}] FAILED: cannot read {path}: {e}"
    if not isinstance(r, dict):
        return f"[{section}] FAILED: no result"
    if "error" in r:
        first = str(r["error"]).strip().splitlines()
        return f"[{section}] FAILED: {first[-1][:300] if first else 'error'}"
    if isinstance(r.get("skipped"), str):   # a section that skipped itself (a test run's "skipped" is a count)
        return f"[{section}] skipped: {r['skipped']}"
    try:
        return f"[{section}] ok: {describe(section, r)}"
    except Exception as e:  # noqa: BLE001 - the summary must never fail the check
        return f"[{section}] ok (summary unavailable: {e!r})"


def junit(path: str, rc: int, env: str, suite: bool = False) -> dict[str, Any]:
    """A pytest run's result from its JUnit XML and exit status: counts, the failed tests, and an ``error`` that
    names the first failures (``suite``: the whole suite, where skips are expected and no test is required)."""
    import xml.etree.ElementTree as ET

    fake = os.environ.get("GPU_CHECK_FAKE") == "1"
    t: dict[str, Any] = {"env": env or "(launch environment)", "pytest_exit_code": rc, "passed": rc == 0,
                         "fake_gpu": fake}
    try:
        root = ET.parse(path).getroot()
        tests = root if root.tag == "testsuite" else root.find("testsuite")
        assert tests is not None
        for k in ("tests", "failures", "errors", "skipped"):
            t[k] = int(tests.get(k, 0))
        t["skipped_because"] = sorted({(s.get("message") or "")[:200] for s in root.iter("skipped")})[:40]
        t["failed"] = [f"{c.get('classname')}::{c.get('name')}" for c in root.iter("testcase")
                       if c.find("failure") is not None or c.find("error") is not None]
    except (OSError, ET.ParseError, AssertionError) as e:
        t["junit_error"] = repr(e)
    failed = t.get("failed") or []
    all_skipped = t.get("tests", 0) and t.get("skipped") == t.get("tests")
    if rc != 0:
        named = f": {len(failed)} failed ({', '.join(failed[:3])}{', ...' if len(failed) > 3 else ''})" if failed else ""
        t["error"] = f"pytest exited with {rc}{named} (124: the timeout; 5: no test collected)"
    elif suite:
        pass
    elif all_skipped and fake:
        t["note"] = "fake GPU: every gpu test skips itself, as it must"
    elif all_skipped:
        t["error"] = "every GPU test was skipped: no usable GPU seen (see skipped_because)"
    return t


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["nvvm"]:
        print(json.dumps(find_nvvm()))
        return 0
    if argv[:1] == ["save"] and len(argv) == 3:
        save(argv[1], argv[2], sys.stdin.read())
        return 0
    if argv[:1] == ["summary"] and len(argv) == 3:
        print(summary(argv[1], argv[2]))
        return 0
    if argv[:1] == ["junit"] and len(argv) in (4, 5):
        print(json.dumps(junit(argv[1], int(argv[2]), argv[3], suite=argv[4:] == ["--suite"])))
        return 0
    if argv[:1] == ["failed"] and len(argv) == 2:   # exit 1 when a section of the file has an error
        with open(argv[1]) as f:
            res = json.load(f)
        bad = [k for k, v in res.items() if isinstance(v, dict) and "error" in v]
        print("failed sections:", ", ".join(bad) or "none")
        return 1 if bad else 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    raise SystemExit(main())
