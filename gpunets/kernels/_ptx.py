"""The PTX check: compile every CUDA kernel for every dtype and K it is launched with, for real GPUs.

``python -m gpunets.kernels --ptx [--cc 80 90]`` runs :func:`main`.  Each (kernel, dtype, K,
compute capability) is compiled with ``numba.cuda.compile_ptx`` from the kernel's Python
function and the argument types the entry points launch it with (``_cuda.launch_types``).
This types and lowers the kernels as a GPU would, which numba's CUDA simulator does not:
no GPU is needed, only libNVVM, which the ``ptx`` extra installs from pip
(``pip install "gpunets[ptx]"``, i.e. ``numba-cuda[cu12]``, whose ``cuda-toolkit[nvcc]``
brings ``nvidia-cuda-nvcc-cu12`` and its ``libnvvm.so``).

The check never runs on the simulator: when ``NUMBA_ENABLE_CUDASIM`` is set, it reruns
itself in a subprocess with the variable removed (numba reads it once, at import).

Exit status: 0 all compiled, 1 some failed, 2 bad arguments, 3 libNVVM not found, 4 numba-cuda cannot run
with the NumPy (or numba) installed here (``_cuda.numba_cuda_problem``).
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
from collections.abc import Sequence
from typing import Any

KS = (1, 2, 8)
CCS = (80, 90)
EXIT_FAILED, EXIT_USAGE, EXIT_NO_NVVM, EXIT_BROKEN = 1, 2, 3, 4
INSTALL_HINT = ('libNVVM was not found: install it from pip with `pip install "numba-cuda[cu12]>=0.20,<0.31"` '
                '(or `pip install "gpunets[ptx]"`; it brings nvidia-cuda-nvcc-cu12, which ships libnvvm), '
                "or point CUDA_HOME at a CUDA toolkit")

_ANSI = re.compile(r"\x1b\[[0-9;]*m")


class UsageError(ValueError):
    """A bad command-line option: printed as one line, exit status 2."""


def first_line(exc: BaseException) -> str:
    """The first non-empty line of an exception's message, without numba's terminal colours."""
    lines = [line.strip() for line in _ANSI.sub("", str(exc)).splitlines() if line.strip()]
    if not lines:
        return type(exc).__name__
    text = lines[0]
    if text.endswith(":") and len(lines) > 1:  # "No implementation of function ... found for signature:"
        text += " " + lines[1]
    return f"{type(exc).__name__}: {text}"


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m gpunets.kernels",
                                description="Compile every CUDA kernel of gpunets.kernels to PTX (no GPU needed).")
    p.add_argument("--ptx", action="store_true", required=True, help="compile the kernels with numba's compile_ptx")
    p.add_argument("--cc", type=int, nargs="+", default=list(CCS), metavar="CC",
                   help="compute capabilities as major*10+minor (default: 80 90)")
    p.add_argument("--kernels", nargs="+", metavar="NAME", help="only these kernels (default: all)")
    p.add_argument("--dtypes", nargs="+", metavar="DTYPE", help="only these dtypes (default: each kernel's own)")
    p.add_argument("--k", type=int, nargs="+", default=list(KS), metavar="K",
                   help="numbers of input arrays (default: 1 2 8)")
    return p.parse_args(argv)


def cases(kernels: dict, kernel_dtypes: dict, names: Sequence[str] | None, dtypes: Sequence[str] | None,
          ks: Sequence[int]) -> list[tuple[str, str, int]]:
    """(kernel, dtype, K) for every kernel and dtype it is launched with, filtered by the options."""
    names = list(kernels) if names is None else list(names)
    unknown = [n for n in names if n not in kernels]
    if unknown:
        raise UsageError(f"unknown kernel(s) {unknown}; the kernels are {sorted(kernels)}")
    bad_k = [k for k in ks if k < 1]
    if bad_k:
        raise UsageError(f"--k takes numbers of arrays >= 1, got {bad_k}")
    out: list[tuple[str, str, int]] = []
    for name in names:
        for dt in kernel_dtypes[name]:
            if dtypes is None or dt in dtypes:
                out.extend((name, dt, k) for k in ks)
    return out


def _cc(value: int) -> tuple[int, int]:
    if value < 10:
        raise UsageError(f"--cc takes compute capabilities as major*10+minor (80 for sm_80), got {value}")
    return divmod(value, 10)


def nvvm_problem(cuda: Any) -> str | None:
    """None when libNVVM loads; otherwise the first line of why not."""
    from numba import types

    def probe(out):
        out[0] = 1.0

    try:
        cuda.compile_ptx(probe, (types.float64[::1],), cc=(8, 0))
    except Exception as exc:  # NvvmSupportError, or the library finder's own error
        return first_line(exc)
    return None


def compile_all(todo: Sequence[tuple[str, str, int]], ccs: Sequence[int], kernels: dict, launch_types: Any,
                cuda: Any) -> list[tuple[str, str, int, int, str]]:
    """(kernel, dtype, K, cc, "ok" or "FAILED: first error line") for every case and compute capability."""
    rows = []
    for name, dt, k in todo:
        sig = launch_types(name, dt, k)
        for cc in ccs:
            try:
                cuda.compile_ptx(kernels[name].py_func, sig, cc=_cc(cc))
                result = "ok"
            except Exception as exc:  # a typing or lowering error: report it, go on
                result = "FAILED: " + first_line(exc)
            rows.append((name, dt, k, cc, result))
    return rows


def table(rows: Sequence[tuple]) -> str:
    """The rows as a fixed-width text table."""
    head = ("kernel", "dtype", "K", "cc", "result")
    cells = [head] + [tuple(str(c) for c in r) for r in rows]
    widths = [max(len(c[i]) for c in cells) for i in range(4)]
    lines = ["  ".join(c[i].ljust(widths[i]) for i in range(4)) + "  " + c[4] for c in cells]
    return "\n".join(lines)


def _rerun_without_simulator(argv: Sequence[str]) -> int:
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    return subprocess.run([sys.executable, "-m", "gpunets.kernels", *argv], env=env).returncode


def main(argv: Sequence[str] | None = None) -> int:
    """Run the PTX check; returns the exit status (see the module docstring)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        args = _parse(argv)
        for cc in args.cc:
            _cc(cc)
    except UsageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except SystemExit as exc:  # argparse: --help (0) or a bad option (2)
        return int(exc.code or 0)
    import numba

    if numba.config.ENABLE_CUDASIM:
        return _rerun_without_simulator(argv)
    from numba import cuda

    from gpunets.kernels import _cuda  # lazy: after the simulator check above; imports numba.cuda

    try:
        todo = cases(_cuda._KERNELS, _cuda.KERNEL_DTYPES, args.kernels, args.dtypes, args.k)
    except UsageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    if not todo:
        print(f"error: no kernel takes the dtypes {args.dtypes}; see python -m gpunets.kernels --help",
              file=sys.stderr)
        return EXIT_USAGE
    problem = _cuda.numba_cuda_problem()   # a numba-cuda that cannot run with this NumPy is no missing libNVVM
    if problem is not None:
        print(f"error: {problem}", file=sys.stderr)
        return EXIT_BROKEN
    problem = nvvm_problem(cuda)
    if problem is not None:
        print(f"error: {INSTALL_HINT} ({problem})", file=sys.stderr)
        return EXIT_NO_NVVM
    start = time.perf_counter()
    rows = compile_all(todo, args.cc, _cuda._KERNELS, _cuda.launch_types, cuda)
    print(table(rows))
    failed = sum(1 for r in rows if r[4] != "ok")
    print(f"{len(rows) - failed} compiled, {failed} failed, in {time.perf_counter() - start:.1f} s "
          f"(numba-cuda {getattr(cuda, '__version__', '') or _version('numba-cuda')}, cc {' '.join(map(str, args.cc))})")
    return EXIT_FAILED if failed else 0


def _version(dist: str) -> str:
    try:
        from importlib.metadata import version

        return version(dist)
    except Exception:
        return "unknown"
