"""Lanes: which tasks of a plan run in order on one stream or thread (GrCUDA's assignment, with vector clocks).

Part of :mod:`gpunets.planning.plan`, which calls :func:`assign_lanes` on every plan it compiles.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    from gpunets.planning.plan import Plan

__all__ = ["assign_lanes", "CLOCK_LIMIT"]

# How many lanes a task's clock remembers; with more lanes it keeps the latest ancestors (see assign_lanes).
CLOCK_LIMIT = 64


def assign_lanes(plan: Plan, max_lanes: int | None = None) -> int:
    """Tag each runnable task with a lane (GrCUDA's stream-assignment policy).

    Source tasks are known before the run and take no lane (``-1``).

    A task other than its parent's first child takes a *free* lane, one whose last
    task is among its ancestors.  That is answered with a vector clock rather than
    ancestor sets: each task keeps, for each lane, the latest of its ancestors on
    that lane (the merge of its dependencies' clocks), and a lane is free exactly
    when that latest ancestor is the lane's last task.  A clock lives only until
    every consumer of its task has been placed, and holds at most
    :data:`CLOCK_LIMIT` lanes (the latest ancestors; with ``max_lanes`` up to
    that, the answer is exact).  Forgetting an ancestor can only call a free lane
    busy, which costs concurrency, never correctness: executors order every
    cross-lane edge (the streams executor waits on the producer's event) and run
    each lane in plan order.  Memory is bounded by the tasks in flight, not the plan.
    """
    tasks = plan.tasks
    clocks: list[dict[int, int] | None] = [None] * len(tasks)   # lane -> latest ancestor key on it
    left = [len(c) for c in plan.consumers]                       # consumers not placed yet
    lane_last: list[int] = []         # last task key on each lane
    lane_load: list[float] = []
    inherited = bytearray(len(tasks))  # parents whose first child already took their lane
    for t in tasks:
        if t.kind == "source":
            continue
        clock: dict[int, int] = {}
        lane = -1
        for d in t.deps:
            parent = tasks[d]
            if parent.kind == "source":
                continue
            for ln, k in clocks[d].items():  # type: ignore[union-attr]
                if clock.get(ln, -1) < k:
                    clock[ln] = k
            if clock.get(parent.lane, -1) < d:
                clock[parent.lane] = d
            left[d] -= 1
            if left[d] == 0:
                clocks[d] = None
            if lane < 0 and not inherited[d]:
                inherited[d] = 1
                lane = parent.lane
        if len(clock) > CLOCK_LIMIT:  # keep the latest ancestors
            clock = dict(sorted(clock.items(), key=lambda kv: kv[1])[-CLOCK_LIMIT:])
        if lane < 0:
            free = [ln for ln, k in clock.items() if lane_last[ln] == k]
            if free:
                lane = min(free, key=lambda i: (lane_load[i], i))
            elif max_lanes is None or len(lane_last) < max_lanes:
                lane = len(lane_last)
                lane_last.append(t.key)
                lane_load.append(0.0)
            else:
                lane = min(range(len(lane_last)), key=lambda i: lane_load[i])
        t.lane = lane
        lane_last[lane] = t.key
        lane_load[lane] += t.cost
        if left[t.key]:
            clocks[t.key] = clock
    plan._n_lanes = len(lane_last)
    return plan._n_lanes
