"""``executor="auto"`` on one GPU: streams where earlier runs measured the GPU busy, serial where the host was.

Every GPU task timed with CUDA events (every fit; ``gn.evaluate(..., trace=True)``) leaves its GPU span and its
host issue span on its node (an operation) or its machine (a fit): :func:`remember`.  On the next plan that runs
on one GPU, :func:`choose_one_gpu` adds them up over the plan's GPU tasks.  With ``G`` the GPU's seconds and
``H`` the host's, a run issued by one thread keeps the GPU busy about ``G / max(G, H)`` of its wall time (the host
runs ahead of the GPU where it issues faster than the GPU computes).  Branches on their own CUDA streams can only
overlap GPU work the host has already issued, so streams pay where that fraction is at least
:data:`gpunets.base.trace.HOST_BOUND_BELOW` (the GPU, not the host, sets the pace), the GPU work spans two lanes
or more, and there is at least :data:`MIN_GPU_SECONDS` of it; else one thread issues everything (serial).

>>> from types import SimpleNamespace as NS
>>> class Node: ...
>>> a, b = Node(), Node()
>>> plan = NS(tasks=[NS(kind="eval", node=a, machine=None, lane=0, device="cuda:0"),
...                  NS(kind="eval", node=b, machine=None, lane=1, device="cuda:0")], n_lanes=2)
>>> choose_one_gpu(plan)[0]          # nothing measured yet
'serial'
>>> remember_task(plan.tasks[0], gpu=0.004, host=0.001); remember_task(plan.tasks[1], gpu=0.004, host=0.001)
>>> choose_one_gpu(plan)[0]
'streams'
>>> remember_task(plan.tasks[0], gpu=0.0001, host=0.004); remember_task(plan.tasks[1], gpu=0.0001, host=0.004)
>>> name, why = choose_one_gpu(plan); name, "host-bound" in why
('serial', True)
>>> fits = NS(tasks=[NS(kind="fit", node=None, machine=a, lane=0, device="cuda:0")], n_lanes=1)
>>> name, why = choose_one_gpu(fits); name, "block the host" in why
('serial', True)
"""

from __future__ import annotations

import weakref
from typing import Any

from gpunets.base.trace import HOST_BOUND_BELOW
from gpunets.executors._cuda_streams import blocks_host

__all__ = ["remember", "remember_task", "measured", "choose_one_gpu", "graphs_pay", "MIN_GPU_SECONDS"]

# Less GPU work than this in a whole plan gains nothing from streams: creating the lanes' streams and events,
# and the hand-over to the issuing thread, cost tens of µs each.
MIN_GPU_SECONDS = 1e-3

# node (an operation) or machine (a fit) -> (GPU seconds, host issue seconds) of its last timed run.
# Weak: a network that is dropped takes its measurements with it.
_SEEN: weakref.WeakKeyDictionary[Any, tuple[float, float]] = weakref.WeakKeyDictionary()


def _owner(task: Any) -> Any:
    return task.machine if task.kind == "fit" else task.node if task.kind == "eval" else None


def remember_task(task: Any, gpu: float, host: float) -> None:
    """Keep ``task``'s measured GPU and host seconds for ``auto``'s next choice."""
    owner = _owner(task)
    if owner is not None:
        try:
            _SEEN[owner] = (max(gpu, 0.0), max(host, 0.0))
        except TypeError:   # an owner that cannot be weakly referenced: not remembered
            pass


def remember(plan: Any, records: list[Any]) -> None:
    """Keep the GPU and host spans of a run's GPU-timed trace records (``issued`` set) on their tasks' owners."""
    tasks = plan.tasks
    for r in records:
        if r.issued is not None and 0 <= r.key < len(tasks):
            remember_task(tasks[r.key], r.end - r.start, r.issued[1] - r.issued[0])


def measured(task: Any) -> tuple[float, float] | None:
    """``(GPU seconds, host seconds)`` of ``task``'s last timed run, or None."""
    owner = _owner(task)
    try:
        return None if owner is None else _SEEN.get(owner)
    except TypeError:   # not weakly referenceable: never remembered
        return None


def _busy(seen: list[tuple[float, float]]) -> tuple[float, float, float]:
    """``(GPU seconds G, host issue seconds H, G / max(G, H))`` over measured tasks (the fraction 1 where nothing
    took time: no evidence of a host-bound run): how busy one issuing thread kept the GPU."""
    g = sum(m[0] for m in seen)
    h = sum(m[1] for m in seen)
    return g, h, (g / max(g, h) if max(g, h) > 0 else 1.0)


def choose_one_gpu(plan: Any, gpu: str = "cuda:0") -> tuple[str, str]:
    """``auto``'s choice for a plan whose tasks run on one GPU, ``"streams"`` or ``"serial"``, and why."""
    gpu_tasks = [t for t in plan.tasks if t.kind in ("eval", "fit") and str(t.device).startswith("cuda")]
    work = [t for t in gpu_tasks if not blocks_host(t)]
    if not work:
        return "serial", (f"the tasks run on one GPU ({gpu}) and all {len(gpu_tasks)} of them block the host (fits, "
                          "cuML calls): a lane thread each would take the GIL from the others, one thread runs "
                          "them fastest")
    seen = [(t, m) for t in work if (m := measured(t)) is not None]
    if 2 * len(seen) < len(work):
        return "serial", (f"the tasks run on one GPU ({gpu}); {len(seen)} of its {len(work)} tasks were timed on "
                          "it before (a fit or trace=True times them), too few to tell whether the GPU or the host "
                          "sets the pace: one thread issues its kernels")
    g, h, busy = _busy([m for _, m in seen])
    if busy < HOST_BOUND_BELOW:
        return "serial", (f"the tasks run on one GPU ({gpu}), host-bound in earlier runs (GPU {g * 1e3:.3g} ms "
                          f"against {h * 1e3:.3g} ms of host issue, busy ~{busy:.0%}): streams cannot overlap "
                          "work the host has not issued, one thread issues fastest")
    if g < MIN_GPU_SECONDS:
        return "serial", (f"the tasks run on one GPU ({gpu}) with {g * 1e3:.3g} ms of GPU work in earlier runs, "
                          f"under {MIN_GPU_SECONDS * 1e3:g} ms: too little for streams to repay their set-up")
    plan.n_lanes  # noqa: B018 - assigns the lanes (on first use)
    lanes = {t.lane for t, m in seen if m[0] > 0}
    if len(lanes) < 2:
        return "serial", (f"the tasks run on one GPU ({gpu}), GPU-bound in earlier runs (busy ~{busy:.0%}) but on "
                          "one branch: nothing to overlap")
    return "streams", (f"the tasks run on one GPU ({gpu}), GPU-bound in earlier runs (GPU {g * 1e3:.3g} ms against "
                       f"{h * 1e3:.3g} ms of host issue, busy ~{busy:.0%}) on {len(lanes)} independent branches: "
                       "a CUDA stream per branch, issued by one thread")


def graphs_pay(plan: Any) -> tuple[bool | None, str]:
    """``graphs="auto"``: whether replaying captured CUDA graphs is expected to pay for this call, and why.

    Replay removes Python's cost of issuing each kernel, so it pays where earlier calls of the plan's GPU tasks
    were **host-bound** (their GPU time under half of ``max(G, H)``, :func:`remember`).  ``None``: fewer than half
    of them were timed yet; the call runs eagerly with its GPU tasks timed, so the next call can tell.

    >>> from types import SimpleNamespace as NS
    >>> class Node: ...
    >>> n = Node()
    >>> plan = NS(kind="call", tasks=[NS(kind="eval", node=n, machine=None, lane=0, device="cuda:0")])
    >>> graphs_pay(plan)[0] is None
    True
    >>> remember_task(plan.tasks[0], gpu=1e-5, host=3e-4); graphs_pay(plan)[0]
    True
    >>> remember_task(plan.tasks[0], gpu=3e-3, host=3e-4); graphs_pay(plan)[0]
    False
    """
    if plan.kind != "call":
        return False, "graphs='auto': this run fits (graph mode replays calls of fitted networks): eager."
    work = [t for t in plan.tasks if t.kind == "eval" and str(t.device).startswith("cuda") and not blocks_host(t)]
    if not work:
        return False, "graphs='auto': no task of this call issues GPU work: eager."
    seen = [m for t in work if (m := measured(t)) is not None]
    if 2 * len(seen) < len(work):
        return None, (f"graphs='auto': {len(seen)} of the call's {len(work)} GPU tasks were timed before: this call "
                      "ran eagerly with its GPU tasks timed, the next decides.")
    g, h, busy = _busy(seen)
    if busy < HOST_BOUND_BELOW:
        return True, (f"graphs='auto': earlier calls were host-bound (GPU {g * 1e3:.3g} ms against {h * 1e3:.3g} ms "
                      f"of host issue, busy ~{busy:.0%}): replaying removes the issue cost.")
    return False, (f"graphs='auto': earlier calls kept the GPU busy (~{busy:.0%}; GPU {g * 1e3:.3g} ms against "
                   f"{h * 1e3:.3g} ms of host issue): replay would save little, eager.")
