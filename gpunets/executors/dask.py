"""Run a plan on a Dask cluster: the plan is lowered to one Dask graph and Dask schedules it.

How a run goes (:meth:`DaskExecutor.run`):

1. A plan with nothing to run (every machine skips) returns at once: no
   cluster is started, contacted or sent anything.
2. Every task function is pickled on the client with cloudpickle.  A task
   that cannot be pickled (a model holding a lock, an open file, ...) fails
   the run with an error naming its machine or node, *before anything is sent*.
3. The source values the plan reads are scattered to the workers in one
   ``client.scatter`` call: once per run, never embedded in a task.
4. The tasks become one graph, submitted with one ``client.get(...,
   sync=False)``: dependencies are Dask keys, so intermediate values stay on
   the workers and move between them only when a consumer runs elsewhere.
   Tasks on ``cuda:N`` are restricted to the worker that owns GPU ``N``
   (see :func:`gpu_owners`); the others may run anywhere.
5. Only what the client needs comes back: each fit's ``(fitted estimator,
   info)`` (committed on the client as soon as it arrives, so machines that
   finished keep their state if a later task fails) and the requested outputs.
6. The run's trace comes from Dask's own diagnostics: the scheduler's task
   stream (``client.get_task_stream``), one record per task, one lane per worker.

Faults: a task that raises is retried ``retries`` times by Dask; a worker that
dies while running a task makes the scheduler run it on another worker, up to
the scheduler's ``distributed.scheduler.allowed-failures`` (set to
``retries`` on a cluster this executor starts), then the run fails with an
error naming the task.  ``timeout`` bounds a run; on expiry the outstanding
work is released and the run fails naming the unfinished tasks.  A run only ever
releases its own keys (never ``client.cancel``), so a failure leaves the user's
other futures on the same client untouched and no key of the run behind.

``dask`` and ``distributed`` are imported only in this module and
:mod:`~gpunets.executors._dask_cluster`, and only when an executor is created
(``pip install "gpunets[dask]"``).  This module lowers a plan to a Dask graph
and runs it; ``_dask_cluster.py`` finds, checks and closes clients and
clusters; ``_dask_worker.py`` holds what runs on the workers (tasks, GPU
pinning, timings).
"""

from __future__ import annotations

import atexit
import re
import threading
import time
import uuid
import weakref
from functools import partial
from typing import Any, Callable

from ..estimators import under_sklearn_config
from ..exceptions import EvaluationError, FitError, NotFittedError, wrap_exception
from ..plan import _apply_fitted, _apply_state, _training_output
from ..scheduler import Run
from ..trace import TraceRecord
from ._args import check_flag, check_mapping, check_seconds
from ._dask_cluster import (INSTALL_HINT, _address_of, _address_or_none, _check_client, _check_cluster, _check_open, _check_security,
                            _close, _default_client, _import_dask_cuda, _worker_client, require_distributed)
from ._dask_state import SUMMARY_ATTRIBUTES, ClientValue, DaskState, GraphKey, Recipe, StateInput
from ._dask_worker import _owners, _run_on_gpu, _run_remote, _state_of, _summary_of, _visible_devices, gpu_owners
from .base import Executor

__all__ = ["DaskExecutor", "gpu_owners", "require_distributed", "INSTALL_HINT"]


def _cuda_index(task: Any) -> int | None:
    """The physical GPU a task is placed on (its ``device``, else its machine's or node's), or None."""
    for dev in (getattr(task, "device", None), getattr(task.machine, "device", None),
                getattr(task.node, "device", None)):
        spec = str(dev) if dev is not None else ""
        if spec.startswith("cuda"):
            _, _, idx = spec.partition(":")
            return int(idx) if idx.isdigit() else 0
    return None


_KEY_RE = re.compile(r"[^A-Za-z0-9_]+")


def _dask_key(task: Any, run_id: str) -> str:
    label = _KEY_RE.sub("_", task.label).strip("_")[:40] or task.kind
    return f"gpunets_{label}-{run_id}-{task.key}"


def _describe(task: Any) -> str:
    if task.kind == "fit":
        label = task.machine.label if task.machine is not None else task.label
        return f"Machine {label}"
    mach = f" (machine {task.machine.label})" if task.machine is not None else ""
    return f"Node {task.label}{mach}"


# --------------------------------------------------------------------------------------------
# The executor
# --------------------------------------------------------------------------------------------
class DaskExecutor(Executor):
    """Run plans on a Dask cluster (``dask.distributed``).

    Parameters
    ----------
    client : distributed.Client or str, optional
        The cluster to use; never closed by this executor.  A scheduler
        address (``"tcp://host:8786"``) connects on first use (the default
        client if it is connected there); a pickled executor carries its
        client's address, not the live client.  Without one, a
        run inside a task on a Dask worker (a composite or stacking model with
        ``executor="dask"`` fitted by an outer Dask run) uses that worker's
        client and secedes from its thread pool while it waits; any other run
        uses the current default client (``distributed.default_client()``) if
        there is one (with ``cluster="local"``), else the cluster ``cluster=``
        names, started by this executor.
    workers : int, optional
        Worker processes of a ``LocalCluster`` this executor starts (default 2,
        one thread each).  Ignored with a client.
    retries : int
        How many times a failing task is retried (Dask's ``retries``), and, on
        a cluster this executor starts, how many times a task whose worker died
        is run again elsewhere (``distributed.scheduler.allowed-failures``).
    timeout : float, optional
        Seconds a run may take before its outstanding tasks are released and
        it fails naming them (default: no limit).
    keep_cluster : bool
        Keep a ``LocalCluster`` this executor starts until :meth:`close` (or
        the end of a ``with`` block, or interpreter exit) instead of closing it
        at the end of each run.  Entering ``with DaskExecutor() as ex:`` keeps it.
    trace : bool
        Record the run's trace from Dask's task stream (the scheduler's
        ``TaskStreamPlugin``, read once per run).
    cluster_kwargs : dict, optional
        Extra keyword arguments for the cluster it starts.
    security : distributed.Security, optional
        TLS settings: for a cluster this executor starts (which then speaks
        ``tls://``; ``distributed.Security.temporary()`` makes a self-signed
        one in memory, needs ``cryptography``) and for connecting to a
        scheduler address.  A cluster it starts listens on 127.0.0.1 only,
        dashboard included, with or without it.
    cluster : {"local", "cuda"} or distributed cluster, optional
        What to start when there is no client: ``"local"`` (default) a
        ``distributed.LocalCluster`` of ``workers`` processes; ``"cuda"`` a
        ``dask_cuda.LocalCUDACluster``, one worker per GPU (``pip install
        dask-cuda``).  A cluster object (e.g. a ``LocalCUDACluster`` you
        started) is used through a client this executor makes and never closed.
        A task placed on ``cuda:N`` runs on the worker that owns GPU ``N``.
    rmm_pool_size : int or str, optional
        With ``cluster="cuda"``: each worker's RMM pool (``"8GB"``), passed to
        ``LocalCUDACluster``.

    Raises
    ------
    ImportError
        If dask or distributed is not installed (``pip install "gpunets[dask]"``),
        or ``cluster="cuda"`` without dask-cuda (at the first run).
    TypeError
        If ``security`` is not a ``distributed.Security``, or ``cluster`` is
        neither a name nor a cluster.

    Examples
    --------
    >>> from dask.distributed import Client, LocalCluster     # doctest: +SKIP
    >>> client = Client(LocalCluster(n_workers=2, threads_per_worker=1))  # doctest: +SKIP
    >>> report = yhat.fit(executor=gn.DaskExecutor(client))  # doctest: +SKIP
    >>> yhat(X_test, executor="dask")                         # doctest: +SKIP
    """

    name = "dask"

    def __init__(self, client: Any = None, *, workers: int | None = None, retries: int = 1,
                 timeout: float | None = None, keep_cluster: bool = False, trace: bool = True,
                 cluster_kwargs: dict[str, Any] | None = None, security: Any = None, cluster: Any = "local",
                 rmm_pool_size: Any = None) -> None:
        _, distributed = require_distributed()
        owner = "DaskExecutor"
        _check_client(client, distributed)
        _check_security(security, distributed)
        _check_cluster(cluster, rmm_pool_size, distributed)
        super().__init__(workers)
        if not isinstance(retries, int) or isinstance(retries, bool) or retries < 0:
            msg = f"retries={retries!r} must be an integer >= 0."
            raise ValueError(msg)
        check_seconds("timeout", timeout, owner, "no limit")
        check_flag("keep_cluster", keep_cluster, owner)
        check_flag("trace", trace, owner)
        cluster_kwargs = check_mapping("cluster_kwargs", cluster_kwargs, owner, "LocalCluster arguments")
        self.client = client
        self.workers = workers or 2
        self.retries = retries
        self.timeout = timeout
        self.keep_cluster = keep_cluster
        self.trace = trace
        self.cluster_kwargs = cluster_kwargs
        self.security = security
        self._address = (_address_or_none(client) if client is not None and not isinstance(client, str)
                         else None)
        self.cluster = cluster
        self.rmm_pool_size = rmm_pool_size
        self._gpu_map: tuple[Any, frozenset[str], dict[int, tuple[list[str], int]]] | None = None
        self._own: tuple[Any, Any] | None = None     # (client, cluster) started here and kept
        self._own_lock = threading.Lock()
        self._states: "weakref.WeakSet[DaskState]" = weakref.WeakSet()   # fitted states kept on the workers
        self._sent: dict[int, tuple[Any, Any]] = {}   # id(local fitted state) -> (client, its scattered future)
        self.last_cluster: Any = None                # the cluster of the last run started here (tests)

    # --- the cluster ----------------------------------------------------------------------
    def _start_cluster(self) -> tuple[Any, Any]:
        """A client of a new cluster (``cluster=``), listening on the loopback interface only.

        Returns ``(client, cluster)``; the cluster is None for a cluster object given to the
        executor (it is not this executor's to close).
        """
        dask, distributed = require_distributed()
        if not isinstance(self.cluster, str):
            return distributed.Client(self.cluster, set_as_default=False), None
        # loopback only: the scheduler, the workers and the dashboard (":0" alone binds every interface)
        kw: dict[str, Any] = {"threads_per_worker": 1, "host": "127.0.0.1", "dashboard_address": "127.0.0.1:0"}
        if self.security is not None:
            kw["security"] = self.security        # LocalCluster then speaks tls://
        if self.cluster == "cuda":
            cuda_cluster = _import_dask_cuda()
            if self.rmm_pool_size is not None:
                kw["rmm_pool_size"] = self.rmm_pool_size
            kw.update(self.cluster_kwargs)
            factory = cuda_cluster
        else:
            kw.update({"n_workers": self.workers, "processes": True})
            kw.update(self.cluster_kwargs)
            factory = distributed.LocalCluster
        with dask.config.set({"distributed.scheduler.allowed-failures": self.retries}):
            cluster = factory(**kw)
            client = distributed.Client(cluster, set_as_default=False, security=self.security)
        self.last_cluster = cluster
        return client, cluster

    def _acquire(self) -> tuple[Any, Callable[[], None] | None, bool]:
        """The client for a run; for a cluster started just for it, how to close it; whether the
        cluster outlives the run (then fitted states stay on the workers)."""
        if self.client is not None and not isinstance(self.client, str):
            _check_open(self.client, self._address)
            return self.client, None, True
        with self._own_lock:
            if self._own is not None:
                return self._own[0], None, True
        nested = _worker_client()
        if isinstance(self.client, str) and nested is None:
            return self._connect(self.client), None, True
        if nested is not None:
            # a run inside a task on a Dask worker (a composite or stacking model fitted with
            # executor="dask" by an outer Dask run): use the worker's client and secede from its
            # thread pool while waiting, so the inner tasks can run even with one thread per worker
            # (never start a cluster from a worker: its daemon processes cannot have children).
            # Its fitted states come back with the outer task's value: they are not kept here.
            client = nested.__enter__()
            return client, lambda: nested.__exit__(None, None, None), False
        current = _default_client() if self.cluster == "local" else None   # "cuda" or a cluster: that one
        if current is not None:
            return current, None, True
        client, cluster = self._start_cluster()
        if self.keep_cluster or cluster is None:
            with self._own_lock:
                self._own = (client, cluster)
            _register_atexit(self)
            return client, None, True
        return client, lambda: _close(client, cluster), False

    def _connect(self, address: str) -> Any:
        """A client of the scheduler at ``address``: the default client if it is one, else a new one kept."""
        current = _default_client()
        if current is not None and _address_of(current) == address:
            return current
        dask, distributed = require_distributed()
        with self._own_lock:
            if self._own is None:
                limit = self.timeout if self.timeout is not None else dask.config.get(
                    "distributed.comm.timeouts.connect")
                try:
                    client = distributed.Client(address, set_as_default=False, timeout=limit,
                                                security=self.security)
                except (OSError, TimeoutError) as e:
                    msg = (f"DaskExecutor could not reach the Dask scheduler at {address} within {limit}{' s' if isinstance(limit, (int, float)) else ''} "
                           f"({type(e).__name__}: {e}). Check the address and that the scheduler runs and "
                           "listens there (a TLS scheduler needs tls:// and security=...).")
                    raise ConnectionError(msg) from e
                self._own = (client, None)
                _register_atexit(self)
            return self._own[0]

    def _constructor_args(self, for_pickle: bool) -> dict[str, Any]:
        named = super()._constructor_args(for_pickle)
        client = named.get("client")
        if for_pickle and client is not None and not isinstance(client, str):
            named["client"] = _address_of(client)   # the live client cannot travel: its scheduler's address does
        cluster = named.get("cluster")
        if for_pickle and cluster is not None and not isinstance(cluster, str):
            named["cluster"] = "local"                # a live cluster cannot travel either: its address does
            if named.get("client") is None:
                named["client"] = cluster.scheduler_address
        if not for_pickle and client is None:
            with self._own_lock:
                own = self._own
            if own is not None:   # a copy (e.g. clone in a grid search) uses the cluster this one keeps
                named["client"] = own[0]
        return named

    def _shared_args(self) -> tuple[str, ...]:
        return ("client", "cluster", "security")   # a copy uses the same cluster

    def close(self) -> None:
        """Release what this executor keeps on the cluster, and close the ``LocalCluster`` it started and kept.

        Fitted states kept on the workers are fetched to their machines first, so they stay usable.
        A client it was given is never closed.
        """
        with self._own_lock:
            own, self._own = self._own, None
            states, self._states = list(self._states), weakref.WeakSet()
            sent, self._sent = list(self._sent.values()), {}
        for st in states:
            st.fetch_and_release()
        _release(f for _, f in sent)
        if own is not None:
            _close(*own)

    def __enter__(self) -> "DaskExecutor":
        self.keep_cluster = True
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        where = ("client" if self.client is not None and not isinstance(self.client, str)
                 else repr(self.client) if self.client is not None else f"LocalCluster(n_workers={self.workers})")
        return f"DaskExecutor({where}, retries={self.retries})"

    # --- a run ----------------------------------------------------------------------------
    def run(self, plan: Any, on_task_done: Any = None) -> Run:
        """Run ``plan`` on the cluster and return the finished :class:`~gpunets.scheduler.Run`."""
        run = Run(plan, executor_name=self.name, on_task_done=on_task_done)
        tasks = [t for t in plan.tasks if t.kind != "source"]
        if not tasks:
            return run   # nothing to do: the cluster is not touched
        states = {t.key: t.fn.args[2] for t in tasks if _applies_state(t.fn)}
        payloads = self._pickle_tasks(run, tasks, states)
        if payloads is None:
            return run   # a task cannot be pickled: nothing was sent
        client, closer, persistent = self._acquire()
        try:
            self._drive(client, run, tasks, payloads, states, persistent)
        finally:
            if closer is not None:
                closer()
        return run

    def _pickle_tasks(self, run: Run, tasks: list[Any], states: dict[int, Any]) -> dict[int, bytes] | None:
        """Each task's function, pickled; one that applies a fitted state gets the state as its last input
        (a key on the cluster, see :meth:`_state_refs`), so the estimator never travels in the graph."""
        import cloudpickle

        payloads: dict[int, bytes] = {}
        for t in tasks:
            fn = t.fn
            if t.key in states:
                fn = partial(_apply_fitted, fn.args[0], fn.args[1])
            if run.plan.sklearn_config:   # scikit-learn's configuration is per thread: the caller's goes along
                fn = partial(under_sklearn_config, run.plan.sklearn_config, fn)
            try:
                payloads[t.key] = cloudpickle.dumps(fn)
            except Exception as e:  # noqa: BLE001 - any pickling failure, reported naming the task
                what = _describe(t)
                model = ""
                if t.machine is not None:
                    model = f" (its model {type(t.machine.model).__name__}, or the fitted estimator)"
                msg = (f"{what} cannot be sent to the Dask workers: it cannot be pickled{model} "
                       f"({type(e).__name__}: {e}). Nothing was sent to the cluster. Make it picklable "
                       "(no locks, open files or connections in its attributes) or use a local executor "
                       "such as executor=\"threads\".")
                _set_error(run, t.key, msg, e)
                return None
        return payloads

    def _state_refs(self, client: Any, run: Run, states: dict[int, Any]) -> dict[int, Any] | None:
        """For each task applying a fitted state, the future of that state on ``client``'s cluster.

        A state fitted on this cluster is its key there; any other (fitted locally, or on another
        client) is scattered once and the future kept until the state is dropped or the executor
        closes.  None (the run failed, naming the task) if a kept state was lost and no copy is left.
        """
        import cloudpickle

        refs: dict[int, Any] = {}
        send: dict[int, Any] = {}
        for k, st in states.items():
            fut = st.stored.future_on(client) if st.is_remote else None
            if fut is None:
                fut = self._sent_before(client, st)
            if fut is None:
                send[k] = st
            else:
                refs[k] = fut
        for k, st in send.items():   # every state to send is checked before the first one is sent
            task = run.plan.tasks[k]
            try:
                cloudpickle.dumps(st.estimator)
            except NotFittedError as e:
                _set_error(run, k, f"{_describe(task)} cannot be evaluated: {e}", e)
                return None
            except Exception as e:  # noqa: BLE001 - any pickling failure, reported naming the task
                msg = (f"{_describe(task)} cannot be sent to the Dask workers: its fitted estimator "
                       f"{type(st.estimator).__name__} cannot be pickled ({type(e).__name__}: {e}). Nothing was "
                       "sent to the cluster. Make it picklable (no locks, open files or connections in its "
                       "attributes) or use a local executor such as executor=\"threads\".")
                _set_error(run, k, msg, e)
                return None
        for k, st in send.items():
            refs[k] = self._send_state(client, st)
        return refs

    def _sent_before(self, client: Any, st: Any) -> Any:
        """The future of local state ``st`` scattered to ``client``'s cluster before, if still there."""
        with self._own_lock:
            got = self._sent.get(id(st))
        if got is not None and got[0] is client and got[1].status not in ("error", "cancelled", "lost"):
            return got[1]
        return None

    def _send_state(self, client: Any, st: Any) -> Any:
        """Scatter fitted state ``st`` to ``client``'s cluster once (the future is kept)."""
        got = self._sent_before(client, st)
        if got is not None:
            return got
        value = (st.estimator, {"path": st.path})
        fut = client.scatter([value], hash=False)[0]
        with self._own_lock:
            old = self._sent.get(id(st))
            self._sent[id(st)] = (client, fut)
        if old is not None:
            _release([old[1]])
        else:
            weakref.finalize(st, self._forget_sent, weakref.ref(self), id(st))
        return fut

    @staticmethod
    def _forget_sent(ref: Any, ident: int) -> None:
        ex = ref()
        if ex is None:
            return
        with ex._own_lock:
            got = ex._sent.pop(ident, None)
        if got is not None:
            _release([got[1]])

    def _drive(self, client: Any, run: Run, tasks: list[Any], payloads: dict[int, bytes],
               states: dict[int, Any], persistent: bool) -> None:
        _, distributed = require_distributed()
        plan = run.plan
        run_id = uuid.uuid4().hex[:12]
        t0_wall = time.time() - (time.perf_counter() - run.t0)
        wanted = [k for k in dict.fromkeys([t.key for t in tasks if t.kind == "fit"] + list(plan.outputs))
                  if plan.tasks[k].kind != "source"]
        restrict = self._placement(client, tasks)
        if isinstance(restrict, str):
            bad = next(t for t in tasks if _cuda_index(t) is not None)
            _set_error(run, bad.key, restrict, ValueError(restrict))
            return
        ctx = _RunContext(states, persistent)
        finished: set[int] = set()       # wanted keys whose values are on the client
        deadline = None if self.timeout is None else time.monotonic() + self.timeout
        resumes = max(1, self.retries)
        attempt = 0
        submitted = False
        try:
            while True:
                refs = self._state_refs(client, run, states)   # each attempt: a lost state is rebuilt first
                if refs is None:
                    break
                ctx.state_refs = refs
                if self.trace and not submitted:
                    _record_task_stream(client)
                submitted = True
                lost = self._submit_and_collect(client, distributed, run, f"{run_id}{attempt or ''}", wanted,
                                                finished, restrict, payloads, deadline, ctx)
                if not lost or run.error is not None:
                    break
                attempt += 1
                if attempt > resumes:
                    k = next(k for k in wanted if k not in finished)
                    msg = (f"{_describe(plan.tasks[k])} could not be computed on Dask: workers died while "
                           f"running it or holding its inputs, {attempt} times (a crash or a killed process, "
                           f"e.g. out of memory); gave up after {resumes} resubmission(s) (retries={self.retries}).")
                    _set_error(run, k, msg, RuntimeError(msg))
                    break
        finally:
            if self.trace and submitted:
                self._collect_trace(client, run, run_id, t0_wall)
        if run.error is None:
            for t in tasks:   # intermediates: done, their values stayed on the workers
                if t.key not in finished and run.claim(t.key):
                    run.complete(t.key, None)

    def _submit_and_collect(self, client: Any, distributed: Any, run: Run, run_id: str, wanted: list[int],
                            finished: set[int], restrict: dict[int, tuple[list[str], int]],
                            payloads: dict[int, bytes], deadline: float | None, ctx: "_RunContext") -> bool:
        """Submit what is still needed; collect it.  True if the cluster lost data (resubmit)."""
        plan = run.plan
        tasks = plan.tasks
        # what to compute: the unfinished wanted keys and their dependencies, down to known values
        # (a fit already committed in a kept state is known by its state's key, unless a task
        # still to run takes its training output, which only the fit itself gives)
        kept_fits = {k: fut for k in finished if (h := ctx.handles.get(k)) is not None
                     and (fut := h.future_on(client)) is not None}
        takes_output = {d for t in tasks if t.fn is _training_output for d in t.deps}
        kept_fits = {k: f for k, f in kept_fits.items() if k not in takes_output}
        have = ({k for k in finished if tasks[k].kind != "fit"} | set(kept_fits)) if ctx.persistent else finished
        known = {t.key for t in tasks if t.kind == "source"} | have
        todo: set[int] = set()
        stack = [k for k in wanted if k not in finished]
        while stack:
            k = stack.pop()
            if k in todo or k in known:
                continue
            todo.add(k)
            stack.extend(tasks[k].deps)
        order = [t for t in tasks if t.key in todo]
        keys = {t.key: _dask_key(t, run_id) for t in order}

        # 1. the values the workers need from the client (the sources; after a loss, finished fits),
        #    scattered in one call
        needed = sorted({d for t in order for d in t.deps if d in known and d not in kept_fits})
        refs: dict[int, Any] = {d: kept_fits[d] for t in order for d in t.deps if d in kept_fits}
        if needed:
            try:
                futs = client.scatter([run.values[k] for k in needed], hash=False)
            except Exception as e:  # noqa: BLE001
                names = ", ".join(tasks[k].label for k in needed)
                msg = (f"The data of {names} could not be sent to the Dask cluster "
                       f"({type(e).__name__}: {e}).")
                _set_error(run, needed[0], msg, e)
                return False
            refs.update(zip(needed, futs))
        refs.update(keys)

        # 2. one graph: one layer for anywhere, one per GPU restriction
        layers: dict[Any, dict[str, tuple[Any, ...]]] = {}
        for t in order:
            gpu = restrict.get(t.key)
            head: tuple[Any, ...] = (_run_remote,) if gpu is None else (_run_on_gpu, gpu[1])
            state = (ctx.state_refs[t.key],) if t.key in ctx.state_refs else ()
            layers.setdefault(None if gpu is None else tuple(gpu[0]), {})[keys[t.key]] = (
                head + (run_id, t.key, payloads[t.key]) + tuple(refs[d] for d in t.deps) + state)
        want = [k for k in wanted if k in keys]
        # a fit on a cluster that outlives the run: its state stays there under its own key (held),
        # and only its info and a few small attributes come back
        keep = [k for k in want if ctx.persistent and tasks[k].kind == "fit" and tasks[k].machine is not None]
        skeys: dict[int, str] = {}
        for k in keep:
            m = tasks[k].machine
            assert m is not None
            mark = _KEY_RE.sub("_", m.label).strip("_")[:40] or "machine"
            skeys[k] = f"gpunets-state-{mark}-v{m._version + 1}-{run_id}-{k}"
            # first in line on their worker: the fit is committed as soon as it is done
            layers.setdefault(_KEPT_LAYER, {})[skeys[k]] = (_state_of, keys[k])
            layers[_KEPT_LAYER][f"gpunets-summary-{run_id}-{k}"] = (_summary_of, keys[k], SUMMARY_ATTRIBUTES)
        asked = [f"gpunets-summary-{run_id}-{k}" if k in skeys else keys[k] for k in want]
        futures = client.get(_graph(layers), asked + [skeys[k] for k in keep], sync=False,
                             retries=self.retries or None)
        state_futs = dict(zip(keep, futures[len(asked):]))
        futures = futures[:len(asked)]
        by_key = {f.key: k for f, k in zip(futures, want)}
        inputs_of = _source_inputs(tasks, keep, refs, needed) if keep else {}
        markers: dict[Any, Any] = {}
        if keep:
            markers.update({refs[d].key: ClientValue(run.values[d]) for d in needed})
            markers.update({f.key: StateInput(ctx.handles[d]) for d, f in kept_fits.items()})
            markers.update({f.key: StateInput(ctx.states[t]) for t, f in ctx.state_refs.items()})

        # 3. what comes back: fits (committed on arrival) and outputs
        lost = False

        def take(fut: Any, draining: bool = False) -> None:
            k = by_key[fut.key]
            value = fut.result()
            if k in state_futs:   # (info, small attributes): the state stays on the workers
                info, attrs = value
                attrs["_path"] = info.get("path", "sklearn")
                attrs["_device"] = info.get("device", "cpu")   # fetched states go back to this device
                handle = DaskState(_describe(tasks[k]).removeprefix("Machine "), client, state_futs.pop(k),
                                   attrs, [distributed.Future(f.key, client) for f in inputs_of[k]],
                                   timeout=self.timeout, recipe=_recipe(layers, skeys[k], markers))
                ctx.handles[k] = handle
                with self._own_lock:
                    self._states.add(handle)
                value = (handle, info)
            finished.add(k)
            if run.claim(k):
                run.complete(k, value)
            elif draining:   # the run has failed: a fit that was running still commits (claimed as running)
                with run.lock:
                    run.n_running += 1
                run.complete(k, value)

        def finish_running(stopped: BaseException | None = None) -> None:
            """After a failure (or Ctrl-C): the fits already running on a worker finish and commit, as on the
            other executors, where running tasks finish; what has not started is released unstarted."""
            left = [f for f in futures if by_key[f.key] not in finished and tasks[by_key[f.key]].kind == "fit"]
            if not left:
                return
            started = _started(client, [keys[by_key[f.key]] for f in left])
            for fut in _completed(distributed, client, [f for f in left if keys[by_key[f.key]] in started],
                                  deadline):
                if fut.status == "finished":
                    take(fut, draining=True)

        try:
            for fut in _completed(distributed, client, futures, deadline):
                k = by_key[fut.key]
                if fut.status == "cancelled":
                    lost = True   # its inputs were lost with a worker: resubmit what is left
                    break
                if fut.status == "error":
                    exc = fut.exception()
                    failed = getattr(exc, "_gn_dask_task", k)   # the task that raised (maybe upstream of k)
                    if not isinstance(failed, int) or not 0 <= failed < len(tasks):
                        failed = k
                    if run.claim(failed):
                        run.fail(failed, exc)
                    finish_running()
                    break
                take(fut)
        except _TimeoutSignal:
            pending = [tasks[k] for k in wanted if k not in finished]
            names = ", ".join(t.label for t in pending[:5]) + (" ..." if len(pending) > 5 else "")
            timeout = self.timeout
            msg = (f"{_describe(pending[0])} did not finish on Dask within timeout={timeout}s "
                   f"(unfinished: {names}); the run's outstanding tasks were released.")
            _set_error(run, pending[0].key, msg, TimeoutError(msg))
        except _cancelled_errors(distributed):
            lost = True
        except BaseException as e:  # KeyboardInterrupt: the running fits commit, the rest is released; re-raise
            try:
                finish_running(e)
            except BaseException:  # noqa: BLE001, S110 - a second Ctrl-C while they finish: stop at once
                pass
            run.abort(e)
            raise
        finally:
            # Release this attempt's own keys (never client.cancel: distributed's cancel walks the
            # dependents of a cancelled key and asserts that some client wants each of them, which
            # fails for a run's intermediates and drops the whole client, cancelling every other
            # future the user holds on it).  A key no client wants any more is forgotten by the
            # scheduler, and a task still running for it is stopped on its worker.
            _release(futures)
            _release(state_futs.values())   # fits that did not finish: their states are not kept
            _release(refs[k] for k in needed)
        return lost

    def _placement(self, client: Any, tasks: list[Any]) -> dict[int, tuple[list[str], int]] | str:
        """``{task key: (worker addresses, GPU ordinal inside those workers)}`` for tasks on a GPU,
        or a message if a task is placed on a GPU that no worker owns (on a cluster of one worker per GPU)."""
        want = {t.key: i for t in tasks if (i := _cuda_index(t)) is not None}
        if not want:
            return {}
        gpus = self._gpu_map_of(client)
        out: dict[int, tuple[list[str], int]] = {}
        for k, gpu in want.items():
            where = gpus.get(gpu)
            if where is None:
                if gpus:   # each worker owns a GPU, none this one: it would run on the wrong GPU
                    task = next(t for t in tasks if t.key == k)
                    return (f"{_describe(task)} is placed on cuda:{gpu}, but no worker of the Dask cluster owns "
                            f"GPU {gpu} (the workers own GPUs {sorted(gpus)}). Nothing was sent. Place it on one "
                            "of those, or start a worker for that GPU (dask_cuda.LocalCUDACluster, "
                            "CUDA_VISIBLE_DEVICES).")
                continue   # no worker owns a GPU in particular: anywhere (the model layer decides CPU/GPU)
            out[k] = where
        return out

    def _gpu_map_of(self, client: Any) -> dict[int, tuple[list[str], int]]:
        """``{physical GPU: (owning workers, its ordinal inside them)}``, asked of the workers once per
        client and set of workers (one ``client.run``)."""
        workers = frozenset(client.scheduler_info().get("workers", {}))
        got = self._gpu_map
        if got is not None and got[0] is client and got[1] == workers:
            return got[2]
        seen = client.run(_visible_devices, on_error="ignore")
        gpus: dict[int, tuple[list[str], int]] = {}
        for gpu, addrs in _owners(seen).items():
            cvd = [x.strip() for x in (seen.get(addrs[0]) or "").split(",")]
            gpus[gpu] = (addrs, cvd.index(str(gpu)) if str(gpu) in cvd else 0)
        self._gpu_map = (client, workers, gpus)
        return gpus

    def _collect_trace(self, client: Any, run: Run, run_id: str, t0_wall: float) -> None:
        """The run's trace from Dask's own task stream (the scheduler's ``TaskStreamPlugin``): one
        record per task of this run that finished or failed, on its worker's lane."""
        try:
            got = client.get_task_stream(start=t0_wall - 1.0)
        except Exception:  # noqa: BLE001 - a trace is not worth failing a run for
            return
        tasks = run.plan.tasks
        for rec in got:
            key = str(rec.get("key", ""))
            if not key.startswith("gpunets_"):
                continue
            head, rid, k = key.rsplit("-", 2)
            if not rid.startswith(run_id) or not k.isdigit() or int(k) >= len(tasks):
                continue
            compute = [ss for ss in rec.get("startstops", ()) if ss.get("action") == "compute"]
            if not compute:
                continue
            t = tasks[int(k)]
            start, end = compute[0]["start"], compute[-1]["stop"]
            run.trace.records.append(TraceRecord(
                key=t.key, kind=t.kind, label=t.label, lane=str(rec.get("worker")), device=str(t.device),
                start=start - t0_wall, end=end - t0_wall, thread=str(rec.get("thread", "")),
                failed=rec.get("status") == "error"))
        run.trace.records.sort(key=lambda r: r.start)


# --------------------------------------------------------------------------------------------
# small helpers
# --------------------------------------------------------------------------------------------
class _TimeoutSignal(Exception):
    pass


class _RunContext:
    """What one run keeps across its attempts: the states it applies and the states its fits keep."""

    def __init__(self, states: dict[int, Any], persistent: bool) -> None:
        self.states = states                  # task key -> the fitted state it applies
        self.state_refs: dict[int, Any] = {}  # task key -> that state's future on the cluster
        self.persistent = persistent          # the cluster outlives the run: fitted states stay there
        self.handles: dict[int, DaskState] = {}   # fit task key -> its kept state


def _recipe(layers: dict[Any, dict[str, tuple[Any, ...]]], root: str, markers: dict[Any, Any]) -> Recipe:
    """The part of a run's graph that computes ``root``, with its inputs as markers (see :class:`Recipe`)."""
    graph = {k: v for dsk in layers.values() for k, v in dsk.items()}
    out: dict[str, tuple[Any, ...]] = {}
    stack = [root]
    while stack:
        key = stack.pop()
        if key in out:
            continue
        task = []
        for e in graph[key]:
            if isinstance(e, str) and e in graph:
                task.append(GraphKey(e))
                stack.append(e)
            elif getattr(e, "key", None) in markers:
                task.append(markers[e.key])
            else:
                task.append(e)
        out[key] = tuple(task)
    return Recipe(out, root)


_STREAMED: "weakref.WeakSet[Any]" = weakref.WeakSet()   # clients whose scheduler records the task stream


def _record_task_stream(client: Any) -> None:
    """Make the scheduler record its task stream (once per client: the first ``get_task_stream``
    installs the ``TaskStreamPlugin``, which then records every task that finishes or fails)."""
    if client in _STREAMED:
        return
    try:
        client.get_task_stream(count=0)
    except Exception:  # noqa: BLE001, S110 - no trace then, the run goes on
        return
    _STREAMED.add(client)


def _applies_state(fn: Any) -> bool:
    """Does task function ``fn`` apply a machine's fitted state (:func:`gpunets.plan._apply_state`)?"""
    return isinstance(fn, partial) and fn.func is _apply_state


def _source_inputs(tasks: list[Any], fits: list[int], refs: dict[int, Any], needed: list[int]) -> dict[int, list[Any]]:
    """For each fit, the scattered values among its ancestors (held with its state, so Dask can
    recompute the state from them if the worker holding it dies)."""
    scattered = set(needed)
    out: dict[int, list[Any]] = {}
    for k in fits:
        seen: set[int] = set()
        stack = list(tasks[k].deps)
        found = []
        while stack:
            d = stack.pop()
            if d in seen:
                continue
            seen.add(d)
            if d in scattered:
                found.append(refs[d])
            else:
                stack.extend(tasks[d].deps)
        out[k] = found
    return out


def _started(client: Any, keys: list[str]) -> set[str]:
    """Which of ``keys`` a worker is running or has finished (the scheduler's ``processing`` / ``memory``)."""
    def states(dask_scheduler: Any, keys: list[str] = keys) -> list[str]:
        return [k for k in keys if (ts := dask_scheduler.tasks.get(k)) is not None
                and ts.state in ("processing", "memory")]

    try:
        return set(client.run_on_scheduler(states))
    except Exception:  # noqa: BLE001 - the scheduler cannot be asked: wait for none
        return set()


def _completed(distributed: Any, client: Any, futures: list[Any], deadline: float | None) -> Any:
    """Yield futures as they finish; raise _TimeoutSignal at ``deadline`` (``time.monotonic()``).

    ``client.loop`` is passed explicitly: without it ``as_completed`` (like
    ``distributed.wait``) needs a *default* client, and a cluster this executor
    starts is deliberately not made the default.
    """
    left = None if deadline is None else max(deadline - time.monotonic(), 1e-3)
    try:
        yield from distributed.as_completed(futures, loop=client.loop, timeout=left)
    except TimeoutError:
        raise _TimeoutSignal from None


def _release(futures: Any) -> None:
    """Drop this client's wants on ``futures`` (each ``Future.release()``; idempotent)."""
    for f in futures:
        try:
            f.release()
        except Exception:  # noqa: BLE001, S110 - a client already closed: nothing is held any more
            pass


def _cancelled_errors(distributed: Any) -> tuple[type[BaseException], ...]:
    import asyncio

    from distributed.client import FuturesCancelledError

    return (FuturesCancelledError, asyncio.CancelledError, getattr(distributed, "CancelledError",
                                                                    asyncio.CancelledError))


_KEPT_LAYER = "kept"   # the layer of the fits' kept states and summaries (run first)


def _graph(layers: dict[Any, dict[str, tuple[Any, ...]]]) -> Any:
    """A plain dict graph, or a HighLevelGraph with one annotated layer per worker restriction."""
    if list(layers) == [None]:
        return layers[None]
    from dask.highlevelgraph import HighLevelGraph, MaterializedLayer

    hl: dict[str, Any] = {}
    for i, (restriction, dsk) in enumerate(layers.items()):
        ann = (None if restriction is None else {"priority": 100} if restriction == _KEPT_LAYER
               else {"workers": list(restriction), "allow_other_workers": False})
        hl[f"gpunets-layer-{i}"] = MaterializedLayer(dsk, annotations=ann)
    return HighLevelGraph(hl, {name: set() for name in hl})


def _set_error(run: Run, key: int, message: str, exc: BaseException) -> None:
    """Fail ``run`` at ``key`` with ``message`` (an error of the task's kind that is also ``type(exc)``)."""

    task = run.plan.tasks[key]
    kind = FitError if task.kind == "fit" else EvaluationError
    err = wrap_exception(kind, message, exc)
    err._gn_task_named = True  # type: ignore[attr-defined]
    err._gn_original = exc  # type: ignore[attr-defined]
    with run.lock:
        if run.error is None:
            run.error = err
        run.changed.notify_all()


_KEPT: "weakref.WeakSet[DaskExecutor]" = weakref.WeakSet()
_ATEXIT = False


def _register_atexit(ex: DaskExecutor) -> None:
    global _ATEXIT
    _KEPT.add(ex)
    if not _ATEXIT:
        _ATEXIT = True
        atexit.register(_close_kept)


def _close_kept() -> None:
    for ex in list(_KEPT):
        try:
            ex.close()
        except Exception:  # noqa: BLE001, S110 - interpreter exit
            pass
