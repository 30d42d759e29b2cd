"""The command line every benchmark script shares: ``--quick``, ``--out FILE``, its own options, a summary.

Each ``bench_*.py`` ends with::

    if __name__ == "__main__":
        raise SystemExit(bench_main(run, __doc__))

``run(quick=..., **options)`` returns the section's results (a JSON-able dict, with ``{"value", "target",
"met"}`` entries for its targets); they are written to ``--out`` (default: ``benchmarks/results/<name>.json``)
and summarised on stdout: one line per target, or the script's own ``summary(results)``.
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Callable, Sequence
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))

Option = tuple[Sequence[str], dict[str, Any]]


def write_json(results: Any, path: str) -> None:
    """Write ``results`` to ``path`` as indented JSON (folders made as needed; odd values as strings)."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(results, f, indent=2, default=str)
        f.write("\n")


def print_targets(results: Any) -> None:
    """One line per target of ``results`` (see ``benchmarks.run.targets``), or the JSON when it has none."""
    from benchmarks.run import targets

    found = targets(results)
    if not found:
        print(json.dumps(results, indent=2, default=str))
    for name, value, target, met in found:
        v = f"{value:.3g}" if isinstance(value, (int, float)) else str(value)
        print(f"{name}: {v} (target {target}) {'met' if met else 'NOT met'}")


def bench_main(run: Callable[..., Any], doc: str | None, argv: list[str] | None = None, *,
               name: str | None = None, options: Sequence[Option] = (),
               summary: Callable[[Any], None] | None = None) -> int:
    """Parse the shared options and the script's ``options``; run; write the JSON; print the summary.

    ``name`` names the default output file (default: the calling script's section, from ``run.__module__``).
    """
    section = name or run.__module__.rsplit(".", 1)[-1].removeprefix("bench_")
    p = argparse.ArgumentParser(description=(doc or section).strip().splitlines()[0])
    p.add_argument("--quick", action="store_true", help="small sizes: checks that the harness runs")
    p.add_argument("--out", default=os.path.join(HERE, "results", f"{section}.json"), help="JSON results file")
    for flags, kw in options:
        p.add_argument(*flags, **kw)
    a = vars(p.parse_args(argv))
    quick, out = a.pop("quick"), a.pop("out")
    results = run(quick=quick, **a)
    write_json(results, out)
    (summary or print_targets)(results)
    print(f"wrote {out}")
    return 0
