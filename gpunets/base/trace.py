"""What ran where and when: a record per task, a timeline plot, Chrome trace export.

>>> t = Trace(executor="serial", kind="fit")
>>> t.records.append(TraceRecord(0, "fit", "fit Ridge", 0, "cpu", 0.0, 0.5, "MainThread"))
>>> t.lanes(), round(t.wall_time, 2)
([0], 0.5)
>>> t.to_chrome_events()[-1]["name"]
'fit Ridge'
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = ["Trace", "TraceRecord", "HOST_BOUND_BELOW"]

#: A run whose GPU was busy less than this fraction of its wall time is host-bound.
HOST_BOUND_BELOW = 0.5


@dataclass
class TraceRecord:
    """One task: what it was, its lane and device, start and end (seconds from the run's start).

    For a GPU task of a run timed with CUDA events (``gn.evaluate(..., trace=True)`` on the CUDA
    streams backend) ``start``/``end`` are when the GPU ran its work and ``issued`` when the host issued it.
    """

    key: int
    kind: str
    label: str
    lane: Any
    device: str
    start: float
    end: float
    thread: str
    failed: bool = False
    issued: tuple[float, float] | None = None   # host issue (start, end) when start/end are GPU times
    parent: str | None = None   # the machine whose own network ran this task (a composite's inner fit)

    @property
    def seconds(self) -> float:
        return self.end - self.start


@dataclass
class Trace:
    """The timeline of one run (a fit or an evaluation)."""

    executor: str = "serial"
    kind: str = "fit"
    origin: float | None = None   # time.perf_counter() at the run's start: times are seconds after it
    graphs: Any = None            # graph mode's report (gpunets.executors.graphs.GraphReport); None: not asked for
    nested: list[TraceRecord] = field(default_factory=list, repr=False)
    _records: list[TraceRecord] = field(default_factory=list, repr=False)
    _raw: list[tuple] = field(default_factory=list, repr=False)   # (task, lane, start, end, thread, device, failed)

    def add(self, task: Any, lane: Any, start: float, end: float, thread: str, device: str | None,
            failed: bool = False) -> None:
        """Record a task cheaply; the :class:`TraceRecord` is built only when read."""
        self._raw.append((task, lane, start, end, thread, device, failed))

    @property
    def records(self) -> list[TraceRecord]:
        """One :class:`TraceRecord` per task run (a list that executors may append to)."""
        if self._raw:
            raw, self._raw = self._raw, []
            self._records.extend(
                TraceRecord(key=t.key, kind=t.kind, label=t.label, lane=t.lane if lane is None else lane,
                            device=str(device or t.device), start=start, end=end, thread=thread, failed=failed)
                for t, lane, start, end, thread, device, failed in raw)
        return self._records

    def __len__(self) -> int:
        return len(self.records)

    def __iter__(self):
        return iter(sorted(self.records, key=lambda r: r.start))

    def lanes(self) -> list[Any]:
        """The lanes used, in order of first use."""
        return _lanes(self.records)

    def all_records(self) -> list[TraceRecord]:
        """This run's records and those of the networks run inside its tasks (``parent`` set), by start."""
        return sorted(self.records + self.nested, key=lambda r: r.start)

    def adopt(self, inner: Trace, parent: str, labels: dict[int, str] | None = None) -> None:
        """Add the records of ``inner``, a run inside one of this run's tasks, as :attr:`nested` records.

        Their times are shifted onto this run's clock, their lanes named after ``parent`` (the
        machine whose network ran) and ``labels`` (task key -> label) renames them.
        """
        if inner.origin is None or self.origin is None:
            return
        shift = inner.origin - self.origin
        labels = labels or {}
        for r in inner.all_records():
            lane = f"{parent} lane {r.lane}" if r.parent is None else r.lane
            label = labels.get(r.key, r.label) if r.parent is None else r.label
            self.nested.append(TraceRecord(r.key, r.kind, f"{parent}: {label}", lane, r.device, r.start + shift,
                                           r.end + shift, r.thread, r.failed, parent=r.parent or parent))

    @property
    def wall_time(self) -> float:
        if not self.records:
            return 0.0
        return max(r.end for r in self.records) - min(r.start for r in self.records)

    @property
    def busy_time(self) -> float:
        return sum(r.seconds for r in self.records)

    # --- the GPU's side (records of GPU tasks timed with CUDA events: ``issued`` set) ------------------
    def gpu_records(self) -> list[TraceRecord]:
        """The records with a GPU span (``start``/``end``) and a host span (``issued``): the GPU tasks of a
        run timed with CUDA events (on a GPU, ``gn.evaluate(..., trace=True)`` and every fit)."""
        return [r for r in self.records if r.issued is not None]

    @property
    def span(self) -> float:
        """Seconds from the first host or GPU start to the last end of this run's records."""
        recs = self.records
        if not recs:
            return 0.0
        first = min(min(r.start, r.issued[0]) if r.issued else r.start for r in recs)
        last = max(max(r.end, r.issued[1]) if r.issued else r.end for r in recs)
        return last - first

    @property
    def gpu_time(self) -> float:
        """Seconds during which the GPU ran work of this run (the union of the GPU spans)."""
        spans = sorted((r.start, r.end) for r in self.gpu_records())
        if not spans:
            return 0.0
        total = 0.0
        cur_lo, cur_hi = spans[0]
        for lo, hi in spans[1:]:
            if lo > cur_hi:
                total += cur_hi - cur_lo
                cur_lo, cur_hi = lo, hi
            else:
                cur_hi = max(cur_hi, hi)
        return total + (cur_hi - cur_lo)

    @property
    def gpu_busy(self) -> float | None:
        """The GPU-busy fraction: GPU time over the run's wall time (None: no GPU task was timed).

        >>> t = Trace()
        >>> t.records.extend([TraceRecord(0, "eval", "a", 0, "cuda:0", 0.1, 0.2, "w", issued=(0.0, 0.05)),
        ...                   TraceRecord(1, "eval", "b", 1, "cuda:0", 0.15, 0.3, "w", issued=(0.05, 1.0))])
        >>> round(t.gpu_busy, 2), t.host_bound
        (0.2, True)
        """
        if not self.gpu_records():
            return None
        span = self.span
        return self.gpu_time / span if span > 0 else None

    @property
    def host_bound(self) -> bool:
        """True where the GPU was busy less than half of the run's wall time: the host set the pace."""
        busy = self.gpu_busy
        return busy is not None and busy < HOST_BOUND_BELOW

    def gpu_summary(self) -> str:
        """One line on the GPU's share of the run ("" where no GPU task was timed); a host-bound run says so."""
        busy = self.gpu_busy
        if busy is None:
            return ""
        n = len(self.gpu_records())
        line = (f"GPU busy {busy:.0%} of the run ({self.gpu_time * 1e3:.2f} of {self.span * 1e3:.2f} ms, "
                f"{n} GPU task{'s' if n != 1 else ''})")
        if busy < HOST_BOUND_BELOW:
            line += (": host-bound, the host issued work slower than the GPU ran it (fewer, larger tasks, "
                     "or the CPU, would do as well; docs/executors.md)")
        return line

    def to_dicts(self) -> list[dict[str, Any]]:
        """One dict per task, nested runs' tasks included (``parent`` names their machine)."""
        return [asdict(r) for r in self.all_records()]

    def to_frame(self) -> Any:
        """A pandas DataFrame, one row per task (nested runs' tasks included), ordered by start.

        Columns: ``key, kind, label, lane, device, start, end, seconds, thread, failed, parent``.

        >>> t = Trace(executor="serial")
        >>> t.records.append(TraceRecord(0, "fit", "fit Ridge", 0, "cpu", 0.0, 0.5, "MainThread"))
        >>> t.to_frame()[["label", "seconds"]].to_dict("records")
        [{'label': 'fit Ridge', 'seconds': 0.5}]
        """
        import pandas as pd

        cols = ["key", "kind", "label", "lane", "device", "start", "end", "seconds", "thread", "failed", "parent"]
        rows = [{**asdict(r), "seconds": r.seconds} for r in self.all_records()]
        return pd.DataFrame(rows, columns=cols)

    def to_chrome_events(self) -> list[dict[str, Any]]:
        """Trace-event dicts ("X" complete events, microseconds), one thread row per lane."""
        records = self.all_records()
        lanes = _lanes(records)
        events: list[dict[str, Any]] = []
        for i, lane in enumerate(lanes):
            events.append({"name": "thread_name", "ph": "M", "pid": 1, "tid": i,
                           "args": {"name": _lane_name(lane)}})
        for r in records:
            events.append({"name": r.label, "cat": r.kind, "ph": "X", "pid": 1, "tid": lanes.index(r.lane),
                           "ts": r.start * 1e6, "dur": max(r.seconds * 1e6, 0.001),
                           "args": {"device": r.device, "thread": r.thread, "key": r.key, "failed": r.failed,
                                    "parent": r.parent,
                                    **({"issued_us": [t * 1e6 for t in r.issued]} if r.issued else {})}})
        events.sort(key=lambda e: (e["ph"] != "M", e.get("ts", 0)))
        return events

    def to_chrome(self, path: str | os.PathLike[str]) -> str:
        """Write Chrome/Perfetto trace-event JSON to ``path``; return the path."""
        payload = {"traceEvents": self.to_chrome_events(), "displayTimeUnit": "ms",
                   "otherData": {"executor": self.executor, "kind": self.kind}}
        with open(path, "w", encoding="utf-8") as f:
            json.dump(payload, f)
        return os.fspath(path)

    def plot(self, ax: Any = None, path: str | os.PathLike[str] | None = None, title: str | None = None) -> Any:
        """Draw the timeline with matplotlib: one row per lane, a bar per task.

        Returns the matplotlib Axes.  With ``path`` the figure is also saved (PNG, SVG, ...); when no
        ``ax`` is given it is then drawn on a standalone :class:`matplotlib.figure.Figure`, so saving
        never touches pyplot or the backend the user chose (inline plots keep working in Jupyter).
        """
        try:
            from matplotlib.figure import Figure
        except ImportError as e:  # pragma: no cover - depends on the environment
            msg = "Trace.plot() needs matplotlib: pip install matplotlib (or gpunets[plot])."
            raise ImportError(msg) from e
        lanes = _lanes(self.all_records())
        size = (10, 0.6 * max(len(lanes), 1) + 1.5)
        if ax is None:
            if path is not None:
                ax = Figure(figsize=size).subplots()
            else:
                import matplotlib.pyplot as plt

                _, ax = plt.subplots(figsize=size)
        self._draw(ax, lanes, title)
        if path is not None:
            ax.figure.tight_layout()
            ax.figure.savefig(path, dpi=120)
        return ax

    def _draw(self, ax: Any, lanes: list[Any], title: str | None) -> None:
        colors = {"fit": "tab:blue", "eval": "tab:green", "move": "tab:orange", "source": "tab:gray"}
        for r in self.all_records():
            row = lanes.index(r.lane)
            if r.issued is not None:   # the host's issue span, thin, under the GPU span
                ax.barh(row + 0.35, (r.issued[1] - r.issued[0]) * 1e3, left=r.issued[0] * 1e3, height=0.12,
                        color="tab:gray", edgecolor="none")
            ax.barh(row, r.seconds * 1e3, left=r.start * 1e3, height=0.6,
                    color="tab:red" if r.failed else colors.get(r.kind, "tab:purple"), edgecolor="black",
                    linewidth=0.3)
            if r.seconds > 0.06 * max(self.wall_time, 1e-9):
                text = r.label.split(": ", 1)[-1] if r.parent else r.label   # the lane names the parent
                ax.text((r.start + r.seconds / 2) * 1e3, row, text[:24], ha="center", va="center", fontsize=7)
        ax.set_yticks(range(len(lanes)))
        ax.set_yticklabels([_lane_name(lane) for lane in lanes])
        ax.invert_yaxis()
        ax.set_xlabel("time (ms)")
        inner = f" (+{len(self.nested)} inside them)" if self.nested else ""
        busy = self.gpu_busy
        gpu = "" if busy is None else f", GPU busy {busy:.0%}" + (" (host-bound)" if self.host_bound else "")
        ax.set_title(title or f"{self.kind} on {self.executor}: {len(self.records)} tasks{inner}, "
                     f"{self.wall_time * 1e3:.1f} ms{gpu}")

    def to_svg(self, title: str | None = None) -> str:
        """The timeline as an SVG document (drawn on a standalone Figure; needs matplotlib)."""
        import io

        from matplotlib.figure import Figure

        lanes = _lanes(self.all_records())
        fig = Figure(figsize=(10, 0.6 * max(len(lanes), 1) + 1.5))
        ax = fig.subplots()
        self._draw(ax, lanes, title)
        fig.tight_layout()
        buf = io.StringIO()
        fig.savefig(buf, format="svg")
        return buf.getvalue()

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, Any]:
        """Jupyter shows the timeline (SVG) when matplotlib is installed, else the one-line summary."""
        bundle: dict[str, Any] = {"text/plain": repr(self)}
        if self.records:
            try:
                bundle["image/svg+xml"] = self.to_svg()
            except ImportError:
                pass
        return bundle

    def __repr__(self) -> str:
        busy = self.gpu_busy
        gpu = "" if busy is None else f", GPU busy {busy:.0%}" + (" (host-bound)" if self.host_bound else "")
        return (f"<Trace {self.kind} on {self.executor}: {len(self.records)} tasks on {len(self.lanes())} lanes, "
                f"{self.wall_time * 1e3:.2f} ms{gpu}>")


def _lanes(records: list[TraceRecord]) -> list[Any]:
    out: list[Any] = []
    for r in sorted(records, key=lambda r: r.start):
        if r.lane not in out:
            out.append(r.lane)
    return out


def _lane_name(lane: Any) -> str:
    return lane if isinstance(lane, str) else f"lane {lane}"
