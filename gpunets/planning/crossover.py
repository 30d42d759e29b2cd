"""Where ``device="auto"`` sends a machine: to the GPU only from the row count where the GPU beats the CPU.

On one GPU, Python issues each CuPy kernel in ~15-33 us, so a machine fitted on a few thousand rows spends its
time on the host, and the CPU does it faster (docs/benchmarks.md, ``gpu_vs_cpu``). A machine *placed by
default* (no ``device=`` of its own, no ``gn.device`` block, ``gn.config(device="auto")``) whose training data
has fewer rows than the **crossover** of its kind trains on the CPU instead; a machine placed on ``"cuda"``
anywhere (its own ``device=``, a block, the config) stays where it was asked.

The crossover table maps an estimator's class name (``"Ridge"``, ``"PCA"``...) to a row count; ``"default"``
covers the kinds not listed. :data:`MEASURED` is the table shipped with the library, filled from the
``gpu_vs_cpu`` benchmark run on a real GPU (its ``crossover_table``); ``gn.config(gpu_crossover={...})``
overrides entries (``{"default": 50_000}``, ``{"Ridge": 0}`` to always use the GPU for Ridge). The shipped
table applies on real GPUs only: the fake GPU of the tests (``GPUNETS_FAKE_GPU``) exists to run the GPU paths,
so only a configured table applies there.

>>> decide("Ridge", 1_000, table={"Ridge": 100_000})
(False, 'auto: 1,000 rows < 100,000, the GPU crossover for Ridge')
>>> decide("Ridge", 200_000, table={"default": 100_000})
(True, 'auto: 200,000 rows >= 100,000, the GPU crossover (default)')
>>> decide("Ridge", 10, table={})
(True, 'auto: a GPU is here (no crossover for Ridge)')
"""

from __future__ import annotations

from collections.abc import Mapping

from gpunets.base.config import check_crossover, get_config
from gpunets.devices import _gpulibs

__all__ = ["MEASURED", "table", "decide", "check_crossover"]

#: The crossover rows per estimator kind, measured by ``benchmarks/bench_gpu_vs_cpu.py`` on a real GPU.
#: Empty until that run: no kind is kept off the GPU by default. (The first GPU run of the benchmark
#: writes its ``crossover_table`` to ``benchmarks/results/gpu_vs_cpu.json``; copy it here.)
MEASURED: dict[str, int] = {}


def table() -> dict[str, int]:
    """The crossover table in force here: the shipped one (on a real GPU), updated by ``gn.config(gpu_crossover=)``."""
    out = {} if _gpulibs.fake_gpu_count() else dict(MEASURED)
    override = get_config().get("gpu_crossover")
    if override:
        out.update(override)
    return out


def threshold(kind: str, table: Mapping[str, int]) -> tuple[int | None, str]:
    """(rows, which entry) for estimator kind ``kind``: its own entry, else ``"default"``, else (None, "")."""
    if kind in table:
        return table[kind], f"for {kind}"
    if "default" in table:
        return table["default"], "(default)"
    return None, ""


def decide(kind: str, rows: int | None, table: Mapping[str, int]) -> tuple[bool, str]:
    """(on the GPU?, why) for a machine of ``kind`` placed by default, trained on ``rows`` rows, a GPU being here."""
    limit, entry = threshold(kind, table)
    if limit is None:
        return True, f"auto: a GPU is here (no crossover for {kind})"
    if rows is None:
        return True, f"auto: a GPU is here (its rows are unknown before the run; crossover {limit:,} {entry})"
    if rows < limit:
        return False, f"auto: {rows:,} rows < {limit:,}, the GPU crossover {entry}"
    return True, f"auto: {rows:,} rows >= {limit:,}, the GPU crossover {entry}"
