"""Saving and loading fitted networks and composites, without their training data.

:func:`save` writes a node (with every machine upstream of it and their
fitted states), a machine, a fitted composite or stack, or any estimator
holding them, to one file; :func:`load` reads it back.  As MLJ's
``serializable`` does, the file never holds training data: sources keep their
name (so the loaded network can be called on new data, ``yhat(Xnew)``) but not
their data, and nothing a fit kept of them (a composite's own copy of ``X``,
fingerprints, traces) is written.

Values on a GPU (CuPy arrays in fitted states, cuDF objects, fitted cuML
estimators, which are stored as their scikit-learn twins) are copied to the
host when saved.  When loaded they go back to the device they were on where
that device exists here; elsewhere they stay on the host and the machines
run on the CPU, with the usual :class:`~gpunets.DeviceFallbackWarning` (or
the error ``gn.config(fallback="raise")`` asks for).

The file is a zip archive: ``gpunets.json`` (the gpunets version, the format
and its version, read before anything else) and the payload, written with
:mod:`pickle` (``format="pickle"``, the default) or with ``skops.io``
(``format="skops"``, needs ``pip install "gpunets[persist]"``).

.. warning::
   Loading a pickle runs code chosen by whoever wrote the file.  Load pickle
   files only from sources you trust; for files from elsewhere use
   ``format="skops"``, which loads only types on a trusted list (gpunets'
   own, NumPy's, scikit-learn's, and those you name with ``trusted=[...]``).

The loader, not the file, decides what a loaded network may do: a skops file, or a pickle loaded with
``trusted=``, is checked as a whole before anything in it runs (:mod:`gpunets.persistence._persist_check`):
nothing is called while it loads but what builds plain data, no file-touching class is admitted
(:mod:`gpunets.persistence._persist_trust`), and the operations that call what an argument names get only
names from fixed tables.  docs/persistence.md, "What a loaded file can do", says exactly what runs.

The object saved is encoded by :mod:`gpunets.persistence._persist_codec`: the graph as a
table (one entry per source, node and machine, referred to by index), so
shared parts are written once and deep networks need no deep recursion.

>>> import os, tempfile, numpy as np, gpunets as gn
>>> from sklearn.linear_model import Ridge
>>> X, y = gn.source(np.eye(3), name="X"), gn.source(np.arange(3.0), name="y")
>>> yhat = gn.machine(Ridge(), X, y).predict(X)
>>> _ = yhat.fit()
>>> path = os.path.join(tempfile.mkdtemp(), "ridge.gn")
>>> _ = gn.save(yhat, path)
>>> loaded = gn.load(path, allow_pickle=True)   # our own file: we trust it
>>> np.allclose(loaded(np.eye(3)), yhat())
True
>>> loaded.origins[0].data is None
True
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import pickle
import pickletools
import platform
import re
import tempfile
import zipfile
import zlib
from collections.abc import Iterable, Sequence
from importlib import metadata
from typing import Any

import numpy as np
import sklearn

from gpunets import __version__
from gpunets.base.exceptions import GpunetsError
from gpunets.core.machines import Machine
from gpunets.core.nodes import AbstractNode
from gpunets.persistence._persist_check import PICKLE_HELPERS as _PICKLE_HELPERS
from gpunets.persistence._persist_check import Unsafe, Untrusted, check_archive, check_pickle, check_skops
from gpunets.persistence._persist_codec import Archive, DamagedFile, Decoder, Encoder
from gpunets.persistence._persist_trust import TRUSTED_TYPES, never_reason
from gpunets.persistence._persist_trust import is_metric as _is_metric
from gpunets.persistence._persist_trust import resolve as _resolve  # noqa: F401 - its old place
from gpunets.persistence._persist_trust import trusted_by_default as _trusted_by_default

__all__ = ["save", "load", "FORMATS", "FORMAT_VERSION", "TRUSTED_TYPES", "PersistenceError", "UntrustedTypesError"]

#: The file formats :func:`save` writes.
FORMATS = ("pickle", "skops")

#: The version of the file layout; a file with another one is refused with both versions named.
FORMAT_VERSION = 1

_META = "gpunets.json"
_PAYLOAD = {"pickle": "payload.pkl", "skops": "payload.skops"}
_MAGIC = "gpunets.save"

class PersistenceError(GpunetsError, ValueError):
    """A file cannot be loaded: not written by :func:`gpunets.save`, or by an incompatible gpunets version."""


class UntrustedTypesError(GpunetsError, TypeError):
    """A ``format="skops"`` file holds types that are not trusted (name them in ``trusted=[...]``)."""


def _check_target(obj: Any) -> None:
    def ok(x: Any) -> bool:
        if isinstance(x, (AbstractNode, Machine)) or callable(getattr(x, "fit", None)):
            return not isinstance(x, type)
        if isinstance(x, (list, tuple)):
            return len(x) > 0 and all(ok(v) for v in x)
        if isinstance(x, dict):
            return len(x) > 0 and all(ok(v) for v in x.values())
        return False

    if not ok(obj):
        msg = (f"gn.save saves a node, a machine, a composite or another estimator (or a list or dict of them); "
               f"got {obj!r} of type {type(obj).__name__}. Hint: gn.save(yhat, path) with yhat = mach.predict(X).")
        raise TypeError(msg)


def _skops_io() -> Any:
    try:
        import skops.io as sio  # lazy: skops is an optional extra, imported only for format="skops"
    except ImportError as exc:
        msg = ('format="skops" needs the skops package: pip install "gpunets[persist]" (or pip install skops); '
               'or use format="pickle" for files you will only load yourself.')
        raise ImportError(msg) from exc
    return sio


def _versions() -> dict[str, Any]:
    try:
        sk: str | None = metadata.version("skops")   # read from the metadata: skops stays unimported
    except metadata.PackageNotFoundError:
        sk = None
    return {"gpunets": __version__, "python": platform.python_version(), "numpy": np.__version__,
            "sklearn": sklearn.__version__, "skops": sk}


def save(obj: Any, path: str | os.PathLike[str], *, format: str = "pickle") -> str:  # noqa: A002 - the word users know
    """Save a fitted network, machine or composite to ``path``, without its training data.

    Parameters
    ----------
    obj : node, machine, estimator, or a list or dict of them
        A node is saved with every machine upstream of it and their fitted
        states; a composite or stack (or any estimator holding one) with its
        fitted network.  Objects saved together share their machines.
    path : str or path-like
        The file to write (replaced if it exists).
    format : {"pickle", "skops"}, default "pickle"
        ``"pickle"`` stores anything picklable, but loading it runs code:
        only load pickle files you trust.  ``"skops"`` (needs the ``skops``
        package) writes a file that :func:`load` checks against a list of
        trusted types before building anything: use it for files you share.

    Returns
    -------
    str
        The path written.

    Raises
    ------
    ValueError
        For an unknown ``format``.
    TypeError
        For an object that is not a node, machine or estimator, or a node whose operation is a lambda or a
        local function (pickle and skops store functions by name).
    ImportError
        For ``format="skops"`` where skops is not installed.

    Examples
    --------
    >>> import os, tempfile, numpy as np, gpunets as gn
    >>> from sklearn.linear_model import Ridge
    >>> X = gn.source(np.eye(3), name="X")
    >>> mach = gn.machine(Ridge(), X, gn.source(np.ones(3), name="y"))
    >>> _ = mach.fit()
    >>> gn.save(mach.predict(X), os.path.join(tempfile.mkdtemp(), "m.gn"), format="json")
    Traceback (most recent call last):
    ...
    ValueError: gn.save: format='json' is not a format; use 'pickle' or 'skops'...
    """
    if format not in FORMATS:
        msg = (f"gn.save: format={format!r} is not a format; use 'pickle' or 'skops' (skops for files others "
               f"will load: loading a pickle runs code).")
        raise ValueError(msg)
    _check_target(obj)
    sio = _skops_io() if format == "skops" else None
    enc = Encoder()
    archive = enc.run(obj)
    if sio is not None:
        try:
            payload = sio.dumps(archive)
        except TypeError as exc:
            msg = (f"gn.save(format='skops') cannot store this object: {exc} Use format='pickle' for objects "
                   f"skops does not support (and only load that file where you trust it).")
            raise TypeError(msg) from exc
    else:
        payload = pickle.dumps(archive, protocol=pickle.HIGHEST_PROTOCOL)
    meta = {"magic": _MAGIC, "format": format, "format_version": FORMAT_VERSION, "object": type(obj).__name__,
            "devices": sorted(enc.devices), **_versions()}
    path = os.fspath(path)
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        zf.writestr(_META, json.dumps(meta, indent=1))
        zf.writestr(_PAYLOAD[format], payload)
    _write_atomically(path, buf.getvalue())
    return path


def _write_atomically(path: str, data: bytes) -> None:
    """Write ``data`` to ``path`` whole or not at all.

    The bytes go to a temporary file of its own in the same folder (unique to this call, so two threads or
    processes saving to one path never share it), are flushed to disk, and replace ``path`` in one
    ``os.replace``: a reader sees the old file or a complete new one, and the last complete save wins.
    """
    folder = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=".partial", dir=folder)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o666 & ~_UMASK)   # mkstemp makes it private (0o600); a saved file gets open()'s mode
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.remove(tmp)
        raise


def _read_umask() -> int:
    mask = os.umask(0)   # the only way to read it; done once, at import, not while other threads save
    os.umask(mask)
    return mask


_UMASK = _read_umask()


# ----------------------------------------------------------------- loading


def _series(version: str) -> tuple[str, ...]:
    m = re.match(r"^(\d+)\.(\d+)", version)
    return m.groups() if m else (version,)


def _read_meta(zf: zipfile.ZipFile, path: str) -> dict[str, Any]:
    if _META not in zf.namelist():
        raise _foreign_zip(path, zf.namelist())
    raw = _read(zf, _META, path)
    try:
        meta = json.loads(raw)
    except ValueError as exc:
        raise _damaged(path, f"its {_META} is not readable JSON") from exc
    if not isinstance(meta, dict) or meta.get("magic") != _MAGIC:
        raise _foreign(path, f"its {_META} is not gpunets'")
    theirs, fv = str(meta.get("gpunets", "?")), meta.get("format_version")
    if fv != FORMAT_VERSION or _series(theirs) != _series(__version__):
        msg = (f"{path!r} was written by gpunets {theirs} (file format {fv}); this is gpunets {__version__} "
               f"(file format {FORMAT_VERSION}), which loads only files written by gpunets "
               f"{'.'.join(_series(__version__))}.x. Load it with gpunets {theirs}, or fit the network again "
               f"with this version and save it anew.")
        raise PersistenceError(msg)
    if meta.get("format") not in FORMATS or _PAYLOAD[meta["format"]] not in zf.namelist():
        raise _damaged(path, f"its format {meta.get('format')!r} comes without its payload")
    return meta


def _type_names(trusted: Iterable[Any]) -> list[str]:
    out = []
    for t in trusted:
        if isinstance(t, str):
            out.append(t)
        elif hasattr(t, "__module__") and hasattr(t, "__name__"):
            out.append(f"{t.__module__}.{t.__name__}")
        else:
            msg = f"gn.load: trusted= takes type names or types; got {t!r} of type {type(t).__name__}."
            raise TypeError(msg)
    return out


def _admit_pickled(name: str, named: Sequence[str]) -> bool:
    """Whether a pickle loaded with ``trusted=`` may name ``name`` (what it names, it may call)."""
    if never_reason(name) is not None:
        return False
    return (name in named or name in _PICKLE_HELPERS or _is_metric(name)
            or _trusted_by_default(name, ("gpunets", "numpy", "sklearn")))


def _untrusted_in_pickle(path: str, name: str) -> UntrustedTypesError:
    msg = (f"gn.load: {path!r} (a pickle file) refers to {name!r}, which is not trusted: a pickle calls "
           f"what it names while it loads, so nothing in the file was run. Trust it by name if you trust where "
           f"the file comes from: gn.load(path, trusted=[{name!r}]) (or allow_pickle=True to trust the whole file).")
    return UntrustedTypesError(msg)


def _unsafe(path: str, exc: Unsafe) -> PersistenceError:
    return PersistenceError(
        f"gn.load: {path!r} is refused because of {exc.name}: {exc.why}. gn.load checks a whole file before "
        f"anything in it runs, and nothing in this one was run: a loaded file may build data and call the "
        f"operations gpunets' networks use, not what the file chooses (docs/persistence.md, 'What a loaded "
        f"file can do'). If you made the file yourself, save it again with gn.save.")


def _load_skops(payload: bytes, named: list[str], path: str) -> Any:
    sio = _skops_io()
    try:
        check_skops(payload, named)
    except Unsafe as exc:
        raise _unsafe(path, exc) from None
    try:
        found = set(sio.get_untrusted_types(data=payload))
    except Exception as exc:  # noqa: BLE001 - skops raises many kinds on a damaged payload
        raise _damaged(path, f"its skops payload cannot be read ({type(exc).__name__}: {exc})") from exc
    untrusted = sorted(t for t in found if t not in named and not _trusted_by_default(t) and not _is_metric(t))
    if untrusted:
        from skops.io.exceptions import UNTRUSTED_TYPE_REASONS  # lazy: skops is optional

        notes = "".join(f"\n- {UNTRUSTED_TYPE_REASONS[t]}" for t in untrusted if t in UNTRUSTED_TYPE_REASONS)
        msg = (f"gn.load: {path!r} holds types that are not trusted: {untrusted}. Loading a type can run its "
               f"code, so gn.load builds nothing until you trust them: if you trust where the file comes from and "
               f"these types, load it with gn.load(path, trusted={untrusted!r}).{notes}")
        raise UntrustedTypesError(msg)
    try:
        return sio.loads(payload, trusted=sorted(found))
    except UntrustedTypesError:
        raise
    except Exception as exc:  # noqa: BLE001 - a payload that skops cannot rebuild
        raise _damaged(path, f"its skops payload cannot be rebuilt ({type(exc).__name__}: {exc})") from exc


def _load_pickle(payload: bytes, named: list[str], path: str) -> Any:
    """Unpickle with only trusted names, after checking the whole pickle's opcodes (nothing run before)."""
    try:
        check_pickle(payload, lambda name: _admit_pickled(name, named), named)
    except Untrusted as exc:
        raise _untrusted_in_pickle(path, exc.name) from None
    except Unsafe as exc:
        raise _unsafe(path, exc) from None
    except ValueError as exc:   # pickletools: opcodes it cannot read
        raise _damaged(path, f"its pickle payload cannot be read ({exc})") from exc
    return _RestrictedUnpickler(payload, named, path).load()


class _RestrictedUnpickler(pickle.Unpickler):
    """Unpickles only trusted globals: what ``trusted=`` allows for a pickle file (the pickle docs' recipe), a
    second line behind :func:`~gpunets.persistence._persist_check.check_pickle`."""

    def __init__(self, data: bytes, named: list[str], path: str) -> None:
        super().__init__(io.BytesIO(data))
        self.named, self.path = named, path

    def find_class(self, module: str, name: str) -> Any:
        full = f"{module}.{name}"
        if _admit_pickled(full, self.named):
            return super().find_class(module, name)
        raise _untrusted_in_pickle(self.path, full)


def _damaged(path: str, why: str) -> PersistenceError:
    return PersistenceError(f"{path!r} is damaged: it was written by gn.save but {why}. Save it again from the "
                            f"fitted object, or restore the file from a copy.")


def _foreign(path: str, why: str, hint: str = "") -> PersistenceError:
    return PersistenceError(f"{path!r} is foreign: it was not written by gn.save ({why}); gn.load reads only "
                            f"gn.save's files.{' ' + hint if hint else ''}")


_RESAVE = ("To make a file gn.load reads, load the object where you trust the file and save it with "
           "gn.save(obj, path) (format='skops' for a file you share).")

#: The first bytes of the files joblib.dump writes with compress= (zlib, gzip, bz2, xz, lzma, lz4).
_COMPRESSED = ((b"ZF", "zlib"), (b"\x78\x01", "zlib"), (b"\x78\x5e", "zlib"), (b"\x78\x9c", "zlib"),
               (b"\x78\xda", "zlib"), (b"\x1f\x8b", "gzip"), (b"BZh", "bz2"), (b"\xfd7zXZ\x00", "xz"),
               (b"\x5d\x00\x00", "lzma"), (b"\x04\x22\x4d\x18", "lz4"))


def _is_pickle(data: bytes, whole: bool) -> bool:
    """Whether ``data`` reads as pickle opcodes (read with :mod:`pickletools`, never run)."""
    if len(data) >= 2 and data[0] == 0x80 and 2 <= data[1] <= 5:
        return True
    if not whole or not data:
        return False
    try:
        return any(op.name == "STOP" for op, _, _ in pickletools.genops(data))
    except Exception:  # noqa: BLE001 - not opcodes
        return False


def _not_a_zip(path: str) -> PersistenceError:
    """What a file that is not a zip archive is, if it is a pickle or joblib file (read, never run)."""
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        data = f.read(1 << 20)
    if _is_pickle(data, whole=size <= len(data)):
        joblib = b"joblib" in data
        what = ("a joblib file (joblib.dump)" if joblib
                else "a plain pickle file (pickle.dump, joblib.dump or cloudpickle)")
        use = "joblib.load(path)" if joblib else "pickle.load (or joblib.load)"
        return _foreign(path, f"it is not a zip archive: it is {what}",
                        f"If you trust where it comes from, load it with {use}, which runs code chosen by whoever "
                        f"wrote it. {_RESAVE}")
    for magic, how in _COMPRESSED:
        if data.startswith(magic):
            return _foreign(path, f"it is not a zip archive: it looks like a {how}-compressed file, as "
                                  f"joblib.dump(obj, path, compress=...) writes",
                            f"If it is a joblib file and you trust where it comes from, load it with "
                            f"joblib.load(path), which runs code chosen by whoever wrote it. {_RESAVE}")
    return _foreign(path, "it is not a zip archive")


def _foreign_zip(path: str, names: list[str]) -> PersistenceError:
    """What a zip archive without gn.save's header is, where it is a file of a library users know."""
    if "schema.json" in names:
        return _foreign(path, f"it is a zip archive without {_META}: a skops file (skops.io.dump)",
                        f"Check it with skops.io.get_untrusted_types(file=path), then load it with "
                        f"skops.io.load(path, trusted=[...]). {_RESAVE}")
    if any(n == "data.pkl" or n.endswith("/data.pkl") for n in names):
        return _foreign(path, f"it is a zip archive without {_META}: a PyTorch file (torch.save)",
                        "Load it with torch.load(path, weights_only=True).")
    if names and all(n.endswith(".npy") for n in names):
        return _foreign(path, f"it is a zip archive without {_META}: a NumPy .npz file",
                        "Load it with np.load(path).")
    return _foreign(path, f"it is a zip archive without {_META}")


def _open_archive(path: str) -> zipfile.ZipFile:
    try:
        return zipfile.ZipFile(path)
    except zipfile.BadZipFile as exc:
        with open(path, "rb") as f:
            head = f.read(512)
        # a gn.save file begins with the local header of its metadata member: cut short or overwritten after it
        if head.startswith(b"PK\x03\x04") and _META.encode() in head:
            raise _damaged(path, "it is not a complete zip archive (truncated or overwritten)") from exc
        raise _not_a_zip(path) from exc


def _read(zf: zipfile.ZipFile, name: str, path: str) -> bytes:
    try:
        return zf.read(name)
    except (zipfile.BadZipFile, zlib.error, EOFError, OSError) as exc:   # bad CRC, bad deflate stream, cut short
        raise _damaged(path, f"its member {name!r} cannot be read ({type(exc).__name__}: {exc})") from exc


def load(path: str | os.PathLike[str], *, allow_pickle: bool = False,
         trusted: Sequence[Any] | None = None) -> Any:
    """Load what :func:`save` wrote: the network, machine or estimator, fitted, without training data.

    Sources come back without data: call a loaded node on new data (``yhat(Xnew)`` or ``yhat(X=Xnew)``), or
    give its sources data (``X.data = ...``) before fitting it again.  Values saved from a GPU go back to it
    where it exists here; elsewhere they stay on the host and their machines run on the CPU, with a
    :class:`~gpunets.DeviceFallbackWarning` (``gn.config(fallback="raise")`` makes it an error).

    As NumPy's ``np.load`` does, a pickle is loaded only when the caller asks: the file does not choose.
    ``format="skops"`` files load by default (they build only trusted types); a ``format="pickle"`` file needs
    ``allow_pickle=True`` (you trust the file: loading it may run any code it names) or ``trusted=[...]``
    (it is unpickled with only gpunets', NumPy's and scikit-learn's classes and the names you list).

    Parameters
    ----------
    path : str or path-like
        A file written by :func:`save`.
    allow_pickle : bool, default False
        Load a ``format="pickle"`` file as it is.  Only for files you trust: unpickling runs code chosen by
        whoever wrote the file.
    trusted : list of str or type, optional
        Types (or functions) to trust beyond gpunets', NumPy's and scikit-learn's classes, by their full name
        as the error lists them (``"mymodule.MyComposite"``): they are built, or called when the network runs
        (in a pickle, also while it loads), unchecked.  For a pickle file, loading with ``trusted=`` refuses
        any other global the pickle names.  Names that touch files (``numpy.memmap``, ``gn.Store``, ``os``...)
        are refused whatever this says.

    Returns
    -------
    object
        What was saved, with new identities (as a copy made with :mod:`copy` or :mod:`pickle` has).

    Raises
    ------
    PersistenceError
        A ``ValueError``: the file is *foreign* (not written by :func:`save`; a pickle, joblib or skops file is
        named as such, with what loads it), *damaged* (written by it, then cut short or altered), written by an
        incompatible gpunets version (both versions are named), a pickle file loaded without
        ``allow_pickle=True`` or ``trusted=``, or a file that uses a trusted name to do what a file may not
        (call something while it loads, touch files, hand a call-anything operation a name or callable of its
        choosing): the message names the culprit, and nothing in the file was run.
    UntrustedTypesError
        A ``TypeError``: the file holds types that are not trusted; the message names them.

    Examples
    --------
    >>> import os, tempfile, zipfile, gpunets as gn
    >>> path = os.path.join(tempfile.mkdtemp(), "not-mine.zip")
    >>> with zipfile.ZipFile(path, "w") as zf:
    ...     zf.writestr("model.pkl", b"...")
    >>> gn.load(path)
    Traceback (most recent call last):
    ...
    gpunets.persistence.persist.PersistenceError: '...not-mine.zip' is foreign: it was not written by gn.save ...
    """
    path = os.fspath(path)
    if trusted is not None and (isinstance(trusted, (str, bytes)) or not isinstance(trusted, (list, tuple, set))):
        msg = (f"gn.load: trusted= takes a list of type names or types, e.g. trusted=['mymodule.MyComposite']; "
               f"got {trusted!r}.")
        raise TypeError(msg)
    if not isinstance(allow_pickle, bool):
        msg = f"gn.load: allow_pickle= takes True or False; got {allow_pickle!r}."
        raise TypeError(msg)
    named = _type_names(trusted or ())
    with _open_archive(path) as zf:
        meta = _read_meta(zf, path)
        fmt = meta["format"]
        if fmt == "pickle" and not allow_pickle and trusted is None:
            msg = (f"gn.load: {path!r} is a pickle file, and loading a pickle runs code chosen by whoever wrote "
                   f"it, so gn.load does not unpickle unless asked (as np.load's allow_pickle). If you trust the "
                   f"file, load it with gn.load(path, allow_pickle=True); to trust only gpunets', NumPy's and "
                   f"scikit-learn's classes, gn.load(path, trusted=[]); for files from elsewhere, ask for one "
                   f"saved with gn.save(obj, path, format='skops').")
            raise PersistenceError(msg)
        payload = _read(zf, _PAYLOAD[fmt], path)
    checked = fmt == "skops" or not allow_pickle   # allow_pickle=True: the caller trusts the whole file
    if fmt == "skops":
        archive = _load_skops(payload, named, path)
    else:
        try:
            archive = pickle.loads(payload) if allow_pickle else _load_pickle(payload, named, path)
        except PersistenceError:
            raise
        except UntrustedTypesError:
            raise
        except (pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError, ImportError,
                IndexError, KeyError, MemoryError) as exc:
            raise _damaged(path, f"its pickle payload cannot be read ({type(exc).__name__}: {exc})") from exc
    if not isinstance(archive, Archive):
        raise _damaged(path, f"its payload is a {type(archive).__name__}, not a gpunets archive")
    if checked:
        try:
            check_archive(archive, named)
        except Unsafe as exc:
            raise _unsafe(path, exc) from None
    try:
        return Decoder(archive, path).run()
    except DamagedFile as exc:
        raise _damaged(path, str(exc)) from exc
    except (KeyError, AttributeError, IndexError) as exc:   # a payload that gn.save did not write
        raise _damaged(path, f"{type(exc).__name__}: {exc} while rebuilding the network") from exc
