"""Dask clients and clusters for the dask executor: importing dask, finding, checking and closing clients.

``dask`` and ``distributed`` are imported only inside these functions (``pip install "gpunets[dask]"``).
"""

from __future__ import annotations

from typing import Any

__all__ = ["require_distributed", "INSTALL_HINT"]

INSTALL_HINT = 'pip install "gpunets[dask]"'


def require_distributed() -> tuple[Any, Any]:
    """Import and return ``(dask, distributed)``, or raise an ImportError saying what to install.

    >>> dask, distributed = require_distributed()  # doctest: +SKIP
    """
    try:
        import dask
        import distributed
    except ImportError as e:
        msg = (f"The dask executor needs dask and distributed, which are not installed ({e}). "
               f"Install them with: {INSTALL_HINT}")
        raise ImportError(msg) from e
    return dask, distributed


def _worker_client() -> Any:
    """``distributed.worker_client()`` (not yet entered) inside a task on a worker, else None."""
    from distributed import get_worker, worker_client

    try:
        get_worker()
    except ValueError:
        return None
    return worker_client()


def _default_client() -> Any:
    """The current default ``distributed`` client, or None."""
    from distributed import default_client

    try:
        return default_client()
    except ValueError:
        return None


def _close(client: Any, cluster: Any) -> None:
    try:
        client.close()
    finally:
        if cluster is not None:
            cluster.close()


_ADDRESS_SCHEMES = ("tcp://", "tls://", "inproc://", "ucx://", "ws://", "wss://")


def _check_client(client: Any, distributed: Any) -> None:
    """A ``distributed.Client``, a scheduler address such as ``"tcp://10.0.0.5:8786"``, or None."""
    if client is None or isinstance(client, distributed.Client):
        return
    if isinstance(client, str) and client.startswith(_ADDRESS_SCHEMES) and len(client.split("://", 1)[1]) > 0:
        return
    what = f"the string {client!r}" if isinstance(client, str) else f"a {type(client).__name__}"
    msg = (f"DaskExecutor(client=...) got {what}: expected a distributed.Client, a scheduler address "
           f"starting with one of {list(_ADDRESS_SCHEMES)} (e.g. 'tcp://127.0.0.1:8786'), or None "
           "(the default client, else a LocalCluster started for the run). "
           "Pass the client itself: gn.DaskExecutor(distributed.Client(...)).")
    raise TypeError(msg)


def _address_of(client: Any) -> str:
    return client.scheduler.address
