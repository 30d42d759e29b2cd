"""A content-addressed store of fitted states, on disk: work done once, across fits and sessions.

``gn.set_config(store="path/to/dir")`` (or ``gn.Store(path, max_bytes=...)``, or ``with gn.config(store=...)``
for a block) makes every fit look in the store first: where a machine would train, a state stored under the
same key is loaded instead (the fit report's action ``"stored"``).  The key is made by the planner
(:mod:`gpunets.planning.stored`) from what decides a fit's result: the estimator's class and hyperparameters,
the training data's content and rows, the upstream machines' keys, the device kind and the versions of gpunets
and of the estimator's library.  This module only keeps bytes under keys.

Each entry is one file, ``<dir>/<2 hex>/<32 hex>.gnst``: a header (magic, gpunets version, a CRC-32 checksum
of the payload, its length) and the payload, a pickle of the fitted estimator.  So

* a corrupt or truncated entry fails its checksum: it is dropped and counted (``corrupt``), never served;
* an entry of another gpunets version is a miss (its key differs anyway; the header says so too);
* a write goes to a temporary file in the same folder, renamed into place with :func:`os.replace`: readers in
  other threads and processes see no entry or a whole one, and two writers of one key both write whole files;
* a hit touches the entry's modification time, and when the store passes ``max_bytes`` the least recently
  used entries are deleted (oldest first).  The bound is the folder's, whoever writes it: every writer (thread,
  ``Store`` object, process) adds its writes to a size index in the folder (``.size``, under a file lock), and
  the eviction scans the folder;
* a write that fails (a full disk: ``ENOSPC``) leaves no entry and says why in one warning; the fit succeeds.

A store is trusted local state, like a joblib cache: loading an entry unpickles it, which may run any code it
names.  Point it only at a folder that you (and the processes you trust) write.

>>> import tempfile
>>> s = Store(tempfile.mkdtemp(), max_bytes=1 << 20)
>>> key = bytes(16)
>>> s.get(key) is None
True
>>> s.put(key, {"fitted": [1, 2]})
True
>>> s.get(key), s.info().hits, s.info().entries
({'fitted': [1, 2]}, 1, 1)
"""

from __future__ import annotations

import contextlib
import errno
import numbers
import operator
import os
import pickle
import re
import tempfile
import threading
import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np

try:
    import fcntl
except ImportError:   # pragma: no cover - Windows: the folder is scanned at each write instead
    fcntl = None  # type: ignore[assignment]

from gpunets.base.config import get_config
from gpunets.devices.store_format import (  # noqa: F401 - the entries' format (tests and keys read it here)
    _BUFFERED,
    _MAGIC,
    VERSION,
    _decode,
    _dumps_buffered,
    _encode,
    _header_size,
    _other_version,
    _pack,
    _unpack,
    _write,
    dumps,
)

__all__ = ["Store", "StoreInfo", "StoreWarning", "store_info", "store_clear", "check_store_setting", "dumps",
           "current_store", "DEFAULT_MAX_BYTES"]

#: The size bound of a store given as a path (``gn.set_config(store="dir")``): 8 GiB.
DEFAULT_MAX_BYTES = 8 << 30

_SUFFIX = ".gnst"
_NAME = re.compile(r"^[0-9a-f]{32}\.gnst$")
_INDEX_WIDTH = 20   # the digits of any byte count (< 10**20), padded with spaces
_INDEX = ".size"   # the bytes the entries hold, kept by every writer under a file lock (:meth:`Store._account`)


class StoreWarning(UserWarning):
    """A store entry could not be written (the fit itself succeeded)."""


@dataclass(frozen=True)
class StoreInfo:
    """What a store holds and did in this process (:func:`store_info`).

    ``hits``, ``misses``, ``writes``, ``corrupt`` (entries dropped for a bad checksum), ``evictions`` and
    ``failed`` (writes that failed, e.g. a full disk) count this process's lookups; ``entries`` and ``bytes``
    are what the folder holds now; ``path`` is None when no store is configured.
    """

    path: str | None
    hits: int
    misses: int
    writes: int
    corrupt: int
    evictions: int
    failed: int
    entries: int
    bytes: int
    max_bytes: int


def _size(value: Any) -> int | None:
    """``max_bytes`` as a number of bytes: any integral number (``int``, ``np.int64``: ``operator.index``) or a
    size string; None for anything else (a bool, a float, an unknown string)."""
    if isinstance(value, (bool, np.bool_)):
        return None
    if isinstance(value, numbers.Integral) or (not isinstance(value, (str, float)) and hasattr(value, "__index__")):
        try:
            return operator.index(value)
        except TypeError:
            return None
    if isinstance(value, str):
        m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kmgt]?)i?b?\s*", value.lower())
        if m:
            return int(float(m.group(1)) * (1 << (10 * " kmgt".index(m.group(2) or " "))))
    return None


class Store:
    """A folder of fitted states, bounded by ``max_bytes`` (least recently used entries evicted first).

    Parameters
    ----------
    path : str or os.PathLike
        The folder (made if missing).  Several threads and processes may share it.
    max_bytes : int or str, default 8 GiB
        The size bound: a positive integral number of bytes (``int``, ``np.int64``...), or a size such as
        ``"500MB"`` or ``"2GiB"``.  It bounds the folder, whoever writes it: every process that writes the
        store counts what the folder holds (:meth:`evict`).
    outputs : bool, default False
        Also keep the training outputs of the steps whose ``fit_transform`` may differ from their
        ``transform`` (``PCA``, ``TargetEncoder``...: what ``Pipeline(memory=)`` keeps), so that a search that
        loads such a step passes on its fit's output without fitting it again (docs/store.md, "Training
        outputs").  **These entries hold data derived from the training rows** (the rows transformed);
        without this opt-in the store holds fitted states and scores only.

    Raises
    ------
    ValueError
        ``max_bytes`` is not a positive size, or ``path`` is a file or a folder this process cannot write.
    TypeError
        ``outputs`` is not a bool.

    Examples
    --------
    >>> import tempfile, gpunets as gn
    >>> s = gn.Store(tempfile.mkdtemp(), max_bytes="10MB")
    >>> s.max_bytes
    10485760
    """

    def __init__(self, path: str | os.PathLike[str], max_bytes: int | str = DEFAULT_MAX_BYTES,
                 outputs: bool = False) -> None:
        if not isinstance(outputs, bool):
            msg = (f"store: outputs={outputs!r} of type {type(outputs).__name__} is not a bool: expected True (keep "
                   "the training outputs of steps whose fit_transform differs from transform) or False. Hint: "
                   "gn.Store(path, outputs=True).")
            raise TypeError(msg)
        size = _size(max_bytes)
        if size is None or size <= 0:
            msg = (f"store: max_bytes={max_bytes!r} ({type(max_bytes).__name__}) is not a positive size: expected "
                   "an integral number of bytes > 0 (int, np.int64...) or a size such as '500MB' or '2GiB'. Hint: "
                   "gn.Store(path, max_bytes=2**30) bounds the store at 1 GiB; a float needs int(...).")
            raise ValueError(msg)
        if not isinstance(path, (str, os.PathLike)):
            msg = (f"store={path!r} of type {type(path).__name__} is not a folder: expected a path (str or "
                   "os.PathLike) or gn.Store(path, max_bytes=...). Hint: gn.set_config(store='~/.gpunets-store'); "
                   "store=None turns the store off.")
            raise TypeError(msg)
        self.path = os.path.abspath(os.path.expanduser(os.fspath(path)))
        self.max_bytes = size
        self.outputs = outputs
        _check_folder(self.path)
        self._lock = threading.Lock()
        self.hits = self.misses = self.writes = self.corrupt = self.evictions = self.failed = 0
        self._warned: set[int] = set()
        self._index = os.path.join(self.path, _INDEX)   # the bytes the folder holds, shared by its writers

    def __repr__(self) -> str:
        return f"Store({self.path!r}, max_bytes={self.max_bytes}" + (", outputs=True)" if self.outputs else ")")

    def __reduce__(self) -> Any:   # a Dask worker or a subprocess opens the same folder
        return (Store, (self.path, self.max_bytes, self.outputs) if self.outputs else (self.path, self.max_bytes))

    # --- entries ---------------------------------------------------------------------------------
    def _file(self, key: bytes) -> str:
        h = key.hex()
        return os.path.join(self.path, h[:2], h + _SUFFIX)

    def get(self, key: bytes, probe: bool = False) -> Any:
        """The object stored under ``key`` (a hit), else None (a miss: absent, corrupt or of another version).

        ``probe=True``: a second look for the same fit in another form (a GPU state's CPU twin); its absence
        is not counted as a miss."""
        payload = self._read(key, probe)
        if payload is None:
            return None
        try:
            whole: bytearray = payload.obj  # type: ignore[assignment]  # the entry's bytes, as read
            if whole[:len(_BUFFERED)] == _BUFFERED:   # large arrays: views of the entry's bytes
                return _unpack(payload, len(whole) - len(payload))
            return pickle.loads(payload)   # from the file's bytes as read: no copy of the payload first
        except Exception:  # noqa: BLE001 - a class that no longer loads: a miss, and the entry goes
            self._drop(self._file(key), corrupt=True)
            with self._lock:
                self.hits -= 1
                self.misses += 1
            return None

    def get_bytes(self, key: bytes, probe: bool = False) -> bytes | None:
        """The payload stored under ``key``, checksum verified; None when there is none (counted, unless
        ``probe``)."""
        payload = self._read(key, probe)
        if payload is None:
            return None
        with payload:
            return bytes(payload)

    def _read(self, key: bytes, probe: bool) -> memoryview | None:
        """The payload stored under ``key`` as a view of the file's bytes (read once, checked once, never
        copied), or None, counted as :meth:`get_bytes` says."""
        path = self._file(key)
        try:
            with open(path, "rb", buffering=0) as f:   # into one writable buffer: the arrays' memory, if views
                data = bytearray(os.fstat(f.fileno()).st_size)
                n = f.readinto(data)
            if n != len(data):
                del data[n or 0:]
        except OSError:
            if not probe:
                with self._lock:
                    self.misses += 1
            return None
        payload = _decode(data)
        if payload is None:   # truncated, corrupt, or written by another version
            self._drop(path, corrupt=not _other_version(data))
            with self._lock:
                self.misses += 1
            return None
        with contextlib.suppress(OSError):
            os.utime(path)    # recently used: evicted last
        with self._lock:
            self.hits += 1
        return payload

    def put(self, key: bytes, obj: Any) -> bool:
        """Store ``obj`` (pickled) under ``key``; False when it was not written (one warning says why).  Its
        large arrays (:data:`_OUT_OF_BAND` bytes and more) are written after the pickle, raw and aligned, and
        read back as views of the entry's bytes, never copied (:func:`_pack`)."""
        packed = _dumps_buffered(obj)
        if packed is not None:
            return self._put(key, _pack(*packed), _BUFFERED)
        try:
            payload = dumps(obj)
        except Exception as e:  # noqa: BLE001 - an unpicklable fitted state: not stored, said once
            what = type(obj[0] if isinstance(obj, tuple) and obj else obj).__name__
            self._warn(0, f"a fitted {what} could not be pickled ({type(e).__name__}: {e}), so it is not "
                          "stored; it is fitted again next time.")
            return False
        return self.put_bytes(key, payload)

    def put_bytes(self, key: bytes, payload: bytes) -> bool:
        """Write ``payload`` under ``key`` atomically (temporary file, then :func:`os.replace`)."""
        return self._put(key, payload, _MAGIC)

    def _put(self, key: bytes, payload: bytes, magic: bytes) -> bool:
        path = self._file(key)
        data = _encode(payload, magic)
        folder = os.path.dirname(path)
        tmp = None
        try:
            os.makedirs(folder, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=".", suffix=".partial", dir=folder)
            with os.fdopen(fd, "wb") as f:
                _write(f, data)
            replaced = 0
            with contextlib.suppress(OSError):
                replaced = os.stat(path).st_size   # another writer's entry of the same key: counted once
            os.replace(tmp, path)
            tmp = None
        except OSError as e:
            with self._lock:
                self.failed += 1
            why = "the disk is full" if e.errno == errno.ENOSPC else f"{type(e).__name__}: {e}"
            self._warn(e.errno or -1, f"an entry could not be written to the store {self.path!r} ({why}); the "
                                      "fit succeeded and its state is not stored. Hint: free space, lower "
                                      "max_bytes or clear the store (gn.store_clear()).")
            return False
        finally:
            if tmp is not None:
                with contextlib.suppress(OSError):
                    os.remove(tmp)
        with self._lock:
            self.writes += 1
        if self._account(len(data) - replaced) > self.max_bytes:
            self.evict()
        return True

    def _account(self, delta: int) -> int:
        """Add ``delta`` bytes to the folder's shared size index (under a file lock: every process that writes
        the store counts every write); the bytes the folder holds.  A missing or unreadable index is rebuilt
        by a scan; every eviction scans and rewrites it, so a drift (a process killed between its write and
        this count) lasts until the next eviction at most.  Where files cannot be locked (no ``fcntl``), the
        folder is scanned at each write."""
        if fcntl is None:   # pragma: no cover - Windows: no shared index, a scan each write
            return sum(e[1] for e in self._entries())
        try:
            with _locked(self._index) as fd:
                if fd is None:
                    return sum(e[1] for e in self._entries())
                raw = os.read(fd, 32).strip()
                total = int(raw) + delta if raw.isdigit() else sum(e[1] for e in self._entries())
                _rewrite(fd, max(total, 0))
                return total
        except OSError:
            return sum(e[1] for e in self._entries())

    def _warn(self, code: int, msg: str) -> None:
        with self._lock:
            if code in self._warned:
                return
            self._warned.add(code)
        warnings.warn(msg, StoreWarning, stacklevel=3)

    def _drop(self, path: str, corrupt: bool = False) -> None:
        with contextlib.suppress(OSError):
            size = os.stat(path).st_size
            os.remove(path)
            self._account(-size)
        if corrupt:
            with self._lock:
                self.corrupt += 1

    # --- the folder ------------------------------------------------------------------------------
    def _entries(self) -> list[tuple[float, int, str]]:
        out = []
        with contextlib.suppress(OSError):
            for sub in os.scandir(self.path):
                if not sub.is_dir() or len(sub.name) != 2:
                    continue
                with contextlib.suppress(OSError):
                    for e in os.scandir(sub.path):
                        if _NAME.match(e.name):
                            with contextlib.suppress(OSError):
                                st = e.stat()
                                out.append((st.st_mtime, st.st_size, e.path))
        return out

    def evict(self) -> int:
        """Delete least recently used entries until the folder holds at most ``max_bytes`` (what every process
        wrote: the folder is scanned); how many went.  The shared size index is rewritten with what is left."""
        with _locked(self._index if fcntl is not None else None) as fd:
            entries = sorted(self._entries())
            total = sum(e[1] for e in entries)
            gone = 0
            for _, size, path in entries:
                if total <= self.max_bytes:
                    break
                with contextlib.suppress(OSError):
                    os.remove(path)
                    gone += 1
                total -= size
            if fd is not None:
                _rewrite(fd, total)
        with self._lock:
            self.evictions += gone
        return gone

    def clear(self) -> None:
        """Delete every entry and reset this process's counters."""
        with _locked(self._index if fcntl is not None else None) as fd:
            for _, _, path in self._entries():
                with contextlib.suppress(OSError):
                    os.remove(path)
            if fd is not None:
                _rewrite(fd, sum(e[1] for e in self._entries()))
        with self._lock:
            self.hits = self.misses = self.writes = self.corrupt = self.evictions = self.failed = 0
            self._warned.clear()

    def info(self) -> StoreInfo:
        """This process's counters and what the folder holds now (see :class:`StoreInfo`)."""
        entries = self._entries()
        with self._lock:
            return StoreInfo(self.path, self.hits, self.misses, self.writes, self.corrupt, self.evictions,
                             self.failed, len(entries), sum(e[1] for e in entries), self.max_bytes)


@contextlib.contextmanager
def _locked(path: str | None) -> Any:
    """The size index at ``path`` opened and locked exclusively (``fcntl.flock``: other processes and other
    ``Store`` objects wait) for the block; None for ``path=None`` or when it cannot be opened."""
    if path is None or fcntl is None:
        yield None
        return
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError:
        yield None
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield fd
    finally:
        os.close(fd)   # releases the lock


def _rewrite(fd: int, total: int) -> None:
    """Write ``total`` over the size index: in place, padded to 20 characters (any count it held, written by
    any version, is overwritten whole), so no truncation (a metadata write that costs more than the entry's)."""
    os.pwrite(fd, str(max(total, 0)).ljust(_INDEX_WIDTH).encode(), 0)


def _check_folder(path: str) -> None:
    if os.path.exists(path) and not os.path.isdir(path):
        msg = (f"store={path!r} is a file, not a folder: expected a folder the store can keep its entries in. "
               "Hint: choose another path, e.g. gn.set_config(store='~/.gpunets-store').")
        raise ValueError(msg)
    try:
        os.makedirs(path, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix=".probe.", dir=path)
        os.close(fd)
        os.remove(probe)
    except OSError as e:
        msg = (f"store={path!r} is not a writable folder ({type(e).__name__}: {e.strerror or e}): expected a folder "
               "this process can create and write. Hint: check its permissions, or choose a folder you own.")
        raise ValueError(msg) from None


# --- the setting ------------------------------------------------------------------------------------------

_BY_PATH: dict[tuple[str, int], Store] = {}
_BY_PATH_LOCK = threading.Lock()


def check_store_setting(value: Any) -> Store | None:
    """``gn.config(store=...)``'s value as a :class:`Store` (None: off); a clear error for a bad one.

    A path gives the same :class:`Store` object each time in a process (its counters carry on).

    >>> check_store_setting(None) is None
    True
    >>> import tempfile
    >>> d = tempfile.mkdtemp()
    >>> check_store_setting(d) is check_store_setting(d)
    True
    """
    if value is None or isinstance(value, Store):
        return value
    if isinstance(value, (str, os.PathLike)):
        path = os.path.abspath(os.path.expanduser(os.fspath(value)))
        with _BY_PATH_LOCK:
            s = _BY_PATH.get((path, DEFAULT_MAX_BYTES))
            if s is None:
                s = _BY_PATH[(path, DEFAULT_MAX_BYTES)] = Store(path)
            return s
    msg = (f"store={value!r} of type {type(value).__name__}: expected a folder path, gn.Store(path, max_bytes=...) "
           "or None (no store). Hint: gn.set_config(store='~/.gpunets-store').")
    raise TypeError(msg)


def current_store() -> Store | None:
    """The store in force here (``gn.get_config()["store"]``), or None."""
    return get_config().get("store")


def store_info() -> StoreInfo:
    """Hits, misses, writes, entries and bytes of the store in force (zeros and ``path=None`` without one).

    Examples
    --------
    >>> import tempfile, gpunets as gn
    >>> with gn.config(store=tempfile.mkdtemp()):
    ...     info = gn.store_info()
    >>> (info.entries, info.bytes, info.hits)
    (0, 0, 0)
    >>> gn.store_info().path is None or isinstance(gn.store_info().path, str)
    True
    """
    s = current_store()
    if s is None:
        return StoreInfo(None, 0, 0, 0, 0, 0, 0, 0, 0, 0)
    return s.info()


def store_clear() -> None:
    """Delete every entry of the store in force and reset its counters (nothing without a store).

    Examples
    --------
    >>> import tempfile, gpunets as gn
    >>> with gn.config(store=tempfile.mkdtemp()):
    ...     gn.store_clear()
    ...     gn.store_info().entries
    0
    """
    s = current_store()
    if s is not None:
        s.clear()
