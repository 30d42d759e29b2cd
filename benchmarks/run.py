"""Run every benchmark section, write ``results/*.json`` and the table in ``benchmarks/README.md``.

    python -m benchmarks            # full sizes (minutes on 2 cores)
    python -m benchmarks --quick    # small sizes: checks that the harness runs (CI)
    python -m benchmarks --only executors kernels

Every figure is a ratio measured within one run, so that a shared, noisy
machine affects both sides alike.  Each target is reported with whether it was met.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import importlib
import json
import os
import platform
import sys
import time
import traceback
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

SECTIONS = ["executors", "kernels", "stacking", "dask", "dask_search", "scaling", "fingerprint", "tuning",
            "from_sklearn", "cache", "store", "gpu_vs_cpu", "njobs", "graphs"]


def targets(res: Any, prefix: str = "") -> list[tuple[str, Any, str, Any]]:
    """Every ``{"value", "target", "met"}`` entry of a result, with its dotted name."""
    out = []
    if isinstance(res, dict):
        if {"value", "target", "met"} <= set(res):
            return [(prefix, res["value"], res["target"], res["met"])]
        for k, v in res.items():
            out += targets(v, f"{prefix}.{k}" if prefix else str(k))
    return out


def machine() -> str:
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover
        cores = os.cpu_count()
    gpu = "no GPU"
    try:
        import cupy

        if cupy.cuda.is_available():
            gpu = cupy.cuda.runtime.getDeviceProperties(0)["name"].decode()
    except Exception:  # noqa: BLE001 - no CuPy or no driver: no GPU
        pass
    return f"{platform.machine()}, {cores} cores, Python {platform.python_version()}, {gpu}"


def write_table(results: dict[str, Any], command: str, quick: bool, path: str) -> None:
    rows = []
    for section, res in results.items():
        if "error" in res:
            rows.append(f"| {section} | error: {res['error'].splitlines()[-1][:80]} | | |")
            continue
        for name, value, target, met in targets(res):
            v = f"{value:.3g}" if isinstance(value, (int, float)) else str(value)
            rows.append(f"| {section}.{name} | {v} | {target} | {'yes' if met else 'NO'} |")
        for k, v in res.items():
            if isinstance(v, dict) and "skipped" in v:
                rows.append(f"| {section}.{k} | skipped: {v['skipped']} | | |")
    table = "\n".join(["| figure | value | target | met |", "| --- | --- | --- | --- |", *rows])
    begin, end = "<!-- results -->", "<!-- /results -->"
    block = (f"{begin}\nLast run: {_dt.date.today().isoformat()}, {machine()}, "
             f"{'quick mode (harness check, not the targets)' if quick else 'full sizes'}.\n\n"
             f"Command: `{command}`\n\n{table}\n{end}")
    text = open(path).read() if os.path.exists(path) else "# Benchmarks\n\n"
    if begin in text and end in text:
        text = text[: text.index(begin)] + block + text[text.index(end) + len(end):]
    else:
        text = text.rstrip() + "\n\n## Results\n\n" + block + "\n"
    with open(path, "w") as f:
        f.write(text)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks", description="Run the gpunets benchmarks.")
    p.add_argument("--quick", action="store_true", help="small sizes, under 2 minutes: checks the harness runs")
    p.add_argument("--only", nargs="*", choices=SECTIONS, help="run only these sections")
    p.add_argument("--out", default=os.path.join(HERE, "results"), help="folder for the JSON results")
    p.add_argument("--readme", default=None, help="Markdown file whose results table is rewritten "
                   "(default: benchmarks/README.md for full runs, none for --quick)")
    a = p.parse_args(argv)
    os.makedirs(a.out, exist_ok=True)
    sections = a.only or SECTIONS
    results: dict[str, Any] = {}
    failed = False
    for name in sections:
        t = time.perf_counter()
        print(f"== {name}", flush=True)
        try:
            mod = importlib.import_module(f"benchmarks.bench_{name}")
            res = mod.run(quick=a.quick)
        except Exception:  # noqa: BLE001 - report and go on with the other sections
            res = {"error": traceback.format_exc()}
            failed = True
            print(res["error"], file=sys.stderr)
        res["seconds_total"] = time.perf_counter() - t
        res["date"] = _dt.datetime.now().isoformat(timespec="seconds")
        res["machine"] = machine()
        results[name] = res
        with open(os.path.join(a.out, f"{name}.json"), "w") as f:
            json.dump(res, f, indent=2, default=str)
        for tname, value, target, met in targets(res):
            print(f"   {tname}: {value:.3g} (target {target}) {'met' if met else 'NOT met'}"
                  if isinstance(value, (int, float)) else f"   {tname}: {value}")
    command = "python -m benchmarks" + (" --quick" if a.quick else "") + (
        f" --only {' '.join(a.only)}" if a.only else "")
    readme = a.readme or (None if a.quick else os.path.join(HERE, "README.md"))
    if readme:
        write_table(results, command, a.quick, readme)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
