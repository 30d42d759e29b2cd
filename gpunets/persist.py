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

The object saved is encoded by :mod:`gpunets._persist_codec`: the graph as a
table (one entry per source, node and machine, referred to by index), so
shared parts are written once and deep networks need no deep recursion.

>>> import os, tempfile, numpy as np, gpunets as gn
>>> from sklearn.linear_model import Ridge
>>> X, y = gn.source(np.eye(3), name="X"), gn.source(np.arange(3.0), name="y")
>>> yhat = gn.machine(Ridge(), X, y).predict(X)
>>> _ = yhat.fit()
>>> path = os.path.join(tempfile.mkdtemp(), "ridge.gn")
>>> _ = gn.save(yhat, path)
>>> loaded = gn.load(path)
>>> np.allclose(loaded(np.eye(3)), yhat())
True
>>> loaded.origins[0].data is None
True
"""

from __future__ import annotations

import io
import json
import os
import pickle
import platform
import re
import zipfile
from importlib import metadata
from typing import Any, Iterable, Sequence

import numpy as np
import sklearn

from . import __version__
from ._persist_codec import Archive, DamagedFile, Decoder, Encoder
from .exceptions import GpunetsError
from .machines import Machine
from .nodes import AbstractNode

__all__ = ["save", "load", "FORMATS", "FORMAT_VERSION", "TRUSTED_TYPES", "PersistenceError", "UntrustedTypesError"]

#: The file formats :func:`save` writes.
FORMATS = ("pickle", "skops")

#: The version of the file layout; a file with another one is refused with both versions named.
FORMAT_VERSION = 1

_META = "gpunets.json"
_PAYLOAD = {"pickle": "payload.pkl", "skops": "payload.skops"}
_MAGIC = "gpunets.save"

#: Types and functions of gpunets (and of the Python library, for the node arithmetic) that the skops format
#: loads without being named in ``trusted=``: plain data holders and the operations gpunets' own nodes use.
TRUSTED_TYPES: tuple[str, ...] = (
    "gpunets._persist_codec.Archive", "gpunets._persist_codec.Ref", "gpunets._persist_codec.Record",
    "gpunets._persist_codec.Items", "gpunets._persist_codec.HostValue",
    "gpunets.devices.Device",
    "gpunets.stacking.StackingRegressor", "gpunets.stacking.StackingClassifier",
    "gpunets.ops.combine",
    "gpunets.stacking.take_rows", "gpunets.stacking.assemble_folds", "gpunets.stacking.enforce_order",
    "gpunets.stacking.concat_predictions", "gpunets.stacking.decode_labels",
    "gpunets.stacking.MemberSummary", "gpunets.stacking.summarize_members", "gpunets.stacking.average_folds",
    "gpunets.stacking.prefit_output", "gpunets.stacking.decode_multilabel", "gpunets.stacking.multilabel_proba",
    "gpunets.stacking.enforce_order_partial",
    "functools.partial",
    "sklearn.utils._bunch.Bunch",
    *(f"_operator.{op}" for op in ("add", "sub", "mul", "truediv", "pow", "matmul", "neg", "abs", "getitem")),
    # scikit-learn's cross-validation splitters (a stack's cv=): plain parameter holders, like its estimators
    *(f"sklearn.model_selection._split.{name}" for name in (
        "KFold", "StratifiedKFold", "GroupKFold", "StratifiedGroupKFold", "RepeatedKFold", "RepeatedStratifiedKFold",
        "ShuffleSplit", "StratifiedShuffleSplit", "GroupShuffleSplit", "TimeSeriesSplit", "PredefinedSplit",
        "LeaveOneOut", "LeavePOut", "LeaveOneGroupOut", "LeavePGroupsOut")),
)



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
    partial = f"{path}.partial-{os.getpid()}"   # written whole, then renamed: a failed write leaves `path` as it was
    try:
        with open(partial, "wb") as f:
            f.write(buf.getvalue())
        os.replace(partial, path)
    finally:
        if os.path.exists(partial):
            os.remove(partial)
    return path


# ----------------------------------------------------------------- loading


def _series(version: str) -> tuple[str, ...]:
    m = re.match(r"^(\d+)\.(\d+)", version)
    return m.groups() if m else (version,)


def _read_meta(zf: zipfile.ZipFile, path: str) -> dict[str, Any]:
    try:
        meta = json.loads(zf.read(_META))
    except (KeyError, ValueError) as exc:
        msg = f"{path!r} was not written by gn.save (it has no readable {_META}); gn.load reads only gn.save's files."
        raise PersistenceError(msg) from exc
    if not isinstance(meta, dict) or meta.get("magic") != _MAGIC:
        msg = f"{path!r} was not written by gn.save ({_META} is not gpunets'); gn.load reads only gn.save's files."
        raise PersistenceError(msg)
    theirs, fv = str(meta.get("gpunets", "?")), meta.get("format_version")
    if fv != FORMAT_VERSION or _series(theirs) != _series(__version__):
        msg = (f"{path!r} was written by gpunets {theirs} (file format {fv}); this is gpunets {__version__} "
               f"(file format {FORMAT_VERSION}), which loads only files written by gpunets "
               f"{'.'.join(_series(__version__))}.x. Load it with gpunets {theirs}, or fit the network again "
               f"with this version and save it anew.")
        raise PersistenceError(msg)
    if meta.get("format") not in FORMATS or _PAYLOAD[meta["format"]] not in zf.namelist():
        msg = f"{path!r}: the file is damaged (format {meta.get('format')!r} without its payload)."
        raise PersistenceError(msg)
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


def _load_skops(payload: bytes, trusted: Sequence[Any] | None, path: str) -> Any:
    sio = _skops_io()
    allowed = list(TRUSTED_TYPES) + _type_names(trusted or ())
    untrusted = sorted(set(sio.get_untrusted_types(data=payload)) - set(allowed))
    if untrusted:
        from skops.io.exceptions import UNTRUSTED_TYPE_REASONS  # lazy: skops is optional

        notes = "".join(f"\n- {UNTRUSTED_TYPE_REASONS[t]}" for t in untrusted if t in UNTRUSTED_TYPE_REASONS)
        msg = (f"gn.load: {path!r} holds types that are not trusted: {untrusted}. Loading a type can run its "
               f"code, so gn.load builds nothing until you trust them: if you trust where the file comes from and "
               f"these types, load it with gn.load(path, trusted={untrusted!r}).{notes}")
        raise UntrustedTypesError(msg)
    return sio.loads(payload, trusted=allowed)


def load(path: str | os.PathLike[str], *, trusted: Sequence[Any] | None = None) -> Any:
    """Load what :func:`save` wrote: the network, machine or estimator, fitted, without training data.

    Sources come back without data: call a loaded node on new data (``yhat(Xnew)`` or ``yhat(X=Xnew)``), or
    give its sources data (``X.data = ...``) before fitting it again.  Values saved from a GPU go back to it
    where it exists here; elsewhere they stay on the host and their machines run on the CPU, with a
    :class:`~gpunets.DeviceFallbackWarning` (``gn.config(fallback="raise")`` makes it an error).

    Parameters
    ----------
    path : str or path-like
        A file written by :func:`save`.
    trusted : list of str or type, optional
        For ``format="skops"`` files only: types (or functions) to trust beyond gpunets', NumPy's and
        scikit-learn's, by their full name as the error lists them (``"mymodule.MyComposite"``).

    Returns
    -------
    object
        What was saved, with new identities (as a copy made with :mod:`copy` or :mod:`pickle` has).

    Raises
    ------
    PersistenceError
        A ``ValueError``: the file was not written by :func:`save`, or by a gpunets version that is not
        compatible with this one (both versions are named).
    UntrustedTypesError
        A ``TypeError``: a skops file holds types that are not trusted; the message names them.
    ValueError
        ``trusted=`` given for a pickle file (whose loading runs code whatever is trusted).

    Examples
    --------
    >>> import os, tempfile, zipfile, gpunets as gn
    >>> path = os.path.join(tempfile.mkdtemp(), "not-mine.zip")
    >>> with zipfile.ZipFile(path, "w") as zf:
    ...     zf.writestr("model.pkl", b"...")
    >>> gn.load(path)
    Traceback (most recent call last):
    ...
    gpunets.persist.PersistenceError: '...not-mine.zip' was not written by gn.save ...
    """
    path = os.fspath(path)
    if trusted is not None and (isinstance(trusted, (str, bytes)) or not isinstance(trusted, (list, tuple, set))):
        msg = (f"gn.load: trusted= takes a list of type names or types, e.g. trusted=['mymodule.MyComposite']; "
               f"got {trusted!r}.")
        raise TypeError(msg)
    try:
        zf = zipfile.ZipFile(path)
    except zipfile.BadZipFile as exc:
        msg = f"{path!r} was not written by gn.save (it is not a zip archive); gn.load reads only gn.save's files."
        raise PersistenceError(msg) from exc
    with zf:
        meta = _read_meta(zf, path)
        fmt = meta["format"]
        if fmt == "pickle" and trusted is not None:
            msg = (f"gn.load: {path!r} is a pickle file, and loading a pickle runs code whatever trusted= says; "
                   f"trusted= applies to format='skops' files only. Load it with gn.load(path) only if you trust "
                   f"where it comes from; ask for a format='skops' file otherwise.")
            raise ValueError(msg)
        payload = zf.read(_PAYLOAD[fmt])
    archive = pickle.loads(payload) if fmt == "pickle" else _load_skops(payload, trusted, path)
    if not isinstance(archive, Archive):
        msg = f"{path!r}: the file is damaged (its payload is a {type(archive).__name__}, not a gpunets archive)."
        raise PersistenceError(msg)
    try:
        return Decoder(archive, path).run()
    except DamagedFile as exc:
        raise PersistenceError(f"{path!r}: {exc}") from exc
    except (KeyError, AttributeError, IndexError) as exc:   # a payload that gn.save did not write
        msg = f"{path!r}: the file is damaged ({type(exc).__name__}: {exc} while rebuilding the network)."
        raise PersistenceError(msg) from exc
