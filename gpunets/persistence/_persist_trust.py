"""Which names a file may hold: the trust rules of :func:`gpunets.load` (the loader decides, not the file).

A name in a file (``module.qualname``) is admitted by default when it is

* one of :data:`TRUSTED_TYPES` (functions of the Python library and plain holders that gpunets' networks use);
* a function of gpunets marked with :func:`gpunets.base.saved.saved_operation` (the operations its own
  networks call);
* a scikit-learn metric (what a search's scorer calls);
* a class whose construction builds plain data: gpunets' classes in the packages that hold its networks,
  composites, conversions and searches (:data:`GPUNETS_DATA_PACKAGES`), NumPy's arrays, dtypes, scalars
  and random generators, scikit-learn's estimators and helpers (``format="pickle"`` with ``trusted=``; a
  ``format="skops"`` file gets NumPy's and scikit-learn's from skops' own lists).

A name is judged as the object it refers to (its own module and qualified name), so a class imported into
one of gpunets' modules (``gpunets.persistence.persist.zipfile.ZipFile``) is judged as what it is, never as
gpunets'.  Nothing that touches files or folders is admitted: :data:`NEVER` lists what is refused even where
the rules above would admit it (``numpy.memmap`` opens, creates or zero-fills a file; ``gn.Store`` creates
its folder), and ``trusted=[...]`` cannot open those.
"""

from __future__ import annotations

import importlib
import types
from typing import Any

__all__ = ["TRUSTED_TYPES", "NEVER", "GPUNETS_DATA_PACKAGES", "resolve", "canonical", "trusted_by_default",
           "is_metric", "never_reason", "checked_arguments", "is_dispatching"]

#: Types and functions of gpunets (and of the Python library, for the node arithmetic) that the skops format
#: loads without being named in ``trusted=``: plain data holders and the operations gpunets' own nodes use.
TRUSTED_TYPES: tuple[str, ...] = (
    "gpunets.persistence._persist_codec.Archive", "gpunets.persistence._persist_codec.Ref",
    "gpunets.persistence._persist_codec.Record", "gpunets.persistence._persist_codec.Items",
    "gpunets.persistence._persist_codec.HostValue",
    "gpunets.devices.placement.Device",
    "gpunets.compose.stacking.StackingRegressor", "gpunets.compose.stacking.StackingClassifier",
    "gpunets.core.ops.combine",
    "gpunets.compose._stack_network.take_rows", "gpunets.compose._stack_network.assemble_folds",
    "gpunets.compose._stack_network.enforce_order", "gpunets.compose._stack_network.concat_predictions",
    "gpunets.compose._stack_network.decode_labels", "gpunets.compose._stack_network.MemberSummary",
    "gpunets.compose._stack_network.summarize_members", "gpunets.compose._stack_network.average_folds",
    "gpunets.compose._stack_network.prefit_output", "gpunets.compose._stack_network.decode_multilabel",
    "gpunets.compose._stack_network.multilabel_proba", "gpunets.compose._stack_network.enforce_order_partial",
    "functools.partial",
    "sklearn.utils._bunch.Bunch",
    # a search's scorers: they hold a metric (a public function of sklearn.metrics, trusted below) and its kwargs
    "sklearn.metrics._scorer._PassthroughScorer", "sklearn.metrics._scorer._Scorer",
    "sklearn.metrics._scorer._MultimetricScorer",
    *(f"_operator.{op}" for op in ("add", "sub", "mul", "truediv", "pow", "matmul", "neg", "abs", "getitem")),
    # scikit-learn's cross-validation splitters (a stack's cv=): plain parameter holders, like its estimators
    *(f"sklearn.model_selection._split.{name}" for name in (
        "KFold", "StratifiedKFold", "GroupKFold", "StratifiedGroupKFold", "RepeatedKFold", "RepeatedStratifiedKFold",
        "ShuffleSplit", "StratifiedShuffleSplit", "GroupShuffleSplit", "TimeSeriesSplit", "PredefinedSplit",
        "LeaveOneOut", "LeavePOut", "LeaveOneGroupOut", "LeavePGroupsOut")),
)

#: The packages of gpunets whose classes build plain data (graph objects, composites, conversions, searches,
#: reports): their classes are trusted by default.  gpunets' other classes (the store, executors, the
#: configuration, progress bars, the fake GPU) are not: a file never holds them.
GPUNETS_DATA_PACKAGES = ("gpunets.core", "gpunets.compose", "gpunets.sklearn_import", "gpunets.tuning",
                         "gpunets.compute", "gpunets.api.report", "gpunets.base.trace", "gpunets.base.exceptions",
                         "gpunets.devices.placement", "gpunets.persistence._persist_codec")

#: Refused whatever ``trusted=`` says (module prefixes and names): they touch files, folders or processes
#: when they are built or used.
NEVER: dict[str, str] = {
    "numpy.memmap": "a NumPy memory map opens, creates or zero-fills the file it names",
    "numpy.lib.format.open_memmap": "it opens, creates or zero-fills the file it names",
    "numpy.load": "it reads the file it names", "numpy.save": "it writes the file it names",
    "numpy.fromfile": "it reads the file it names", "numpy.loadtxt": "it reads the file it names",
    "numpy.genfromtxt": "it reads the file it names", "numpy.fromregex": "it reads the file it names",
    "numpy.savez": "it writes the file it names", "numpy.savez_compressed": "it writes the file it names",
    "numpy.savetxt": "it writes the file it names",
    "numpy.lib._datasource": "it downloads and writes files", "numpy.lib._npyio_impl": "it reads and writes files",
    "numpy.lib.npyio": "it reads and writes files", "numpy.testing": "test helpers (temporary files)",
    "gpunets.devices.store": "a store of fitted states creates and writes its folder",
    "gpunets.devices.store_format": "the store's entry codec (raw array bytes after a pickle)",
    "gpunets.executors": "an executor starts threads, processes or a Dask cluster",
    "gpunets.base.config": "gpunets' configuration (a store= path creates a folder)",
    "gpunets.tuning.stored": "it writes results into the store of fitted states in force, under keys it holds",
    "gpunets.tuning.tasks.Stage": "it carries the store key its values are written under (a search's value "
                                  "between tasks, never saved: a file could forge the key)",
    "gpunets.tuning.tasks.Deferred": "it reads the store under a key it carries and fits an estimator when "
                                     "computed (a search's value between tasks, never saved)",
    "gpunets.persistence.persist": "gn.save and gn.load write and read files",
    "gpunets.__main__": "the command line", "gpunets.testing": "test helpers",
    "gpunets.kernels._ptx": "it runs a subprocess", "gpunets.api.display": "it runs a program (dot)",
    "numpy.f2py": "it compiles and runs code", "numpy.distutils": "it compiles and runs code",
    "sklearn.datasets": "it downloads and writes files", "sklearn.utils._testing": "test helpers (temporary files)",
    "sklearn.externals": "vendored code",
    "sklearn.utils.parallel": "it starts processes and writes temporary files (joblib)",
    "sklearn.utils._joblib": "it starts processes and writes temporary files (joblib)", "joblib": "it reads and writes files (joblib.Memory, dump, load)",
    "builtins.open": "it opens files", "io": "it opens files", "_io": "it opens files", "os": "it touches files",
    "posix": "it touches files", "nt": "it touches files", "shutil": "it touches files",
    "pathlib": "it touches files", "tempfile": "it creates files", "subprocess": "it runs programs",
    "zipfile": "it writes files", "tarfile": "it writes files", "pickle": "it runs code",
    "_pickle": "it runs code", "importlib": "it imports code", "builtins.eval": "it runs code",
    "builtins.exec": "it runs code", "builtins.getattr": "it reads any attribute",
    "builtins.setattr": "it writes any attribute", "builtins.__import__": "it imports code",
    "operator.attrgetter": "it reads any attribute", "operator.methodcaller": "it calls any method",
    "_operator.attrgetter": "it reads any attribute", "_operator.methodcaller": "it calls any method",
}


def never_reason(name: str) -> str | None:
    """Why ``name`` is never loaded (it or a module above it is in :data:`NEVER`), else None."""
    parts = name.split(".")
    for i in range(len(parts), 0, -1):
        why = NEVER.get(".".join(parts[:i]))
        if why is not None:
            return why
    return None


def resolve(name: str) -> Any:
    """The object a full dotted name refers to (the longest importable module, then attributes), or None."""
    parts = name.split(".")
    for i in range(len(parts) - 1, 0, -1):
        try:
            obj: Any = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        except Exception:  # noqa: BLE001 - a module that fails to import is not trusted
            return None
        try:
            for attr in parts[i:]:
                obj = getattr(obj, attr)
        except AttributeError:
            return None
        return obj
    return None


def canonical(obj: Any) -> str:
    """Where ``obj`` is defined: its own ``module.qualname`` (what a name in a file is judged as)."""
    return f"{getattr(obj, '__module__', None)}.{getattr(obj, '__qualname__', None)}"


def _in(name: str, packages: tuple[str, ...]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in packages)


#: Classes of the trusted packages that are still not trusted by default (skops' own exceptions: a tree's node
#: indices are not checked when it is built, so a crafted file could read memory out of bounds).
_NOT_BY_DEFAULT = frozenset({"sklearn.tree._tree.Tree"})


def _numpy_data_class(obj: type) -> bool:
    """NumPy's classes that build plain data: arrays, masked arrays, dtypes, scalars, random generators."""
    import numpy as np

    if obj is np.ndarray or issubclass(obj, (np.dtype, np.generic)):
        return True
    mod = obj.__module__
    return (mod in ("numpy.ma", "numpy.ma.core") and obj.__qualname__ in ("MaskedArray", "MaskedConstant")) or mod.startswith(
        "numpy.random")


def trusted_by_default(name: str, packages: tuple[str, ...] = ("gpunets",)) -> bool:
    """The names on :data:`TRUSTED_TYPES`, gpunets' marked operations, and the data classes of ``packages``.

    skops trusts NumPy's and scikit-learn's types itself, so its files add gpunets' classes only; a pickle loaded
    with ``trusted=`` has no such list, and trusts gpunets', NumPy's and scikit-learn's data classes here.
    """
    if never_reason(name) is not None:
        return False
    if name in TRUSTED_TYPES:
        return True
    if name.split(".")[0] not in packages:
        return False
    obj = resolve(name)
    if obj is None:
        return False
    real = canonical(obj)
    if never_reason(real) is not None or real in _NOT_BY_DEFAULT:
        return False
    # a trusted object under another name: where it was defined before gpunets' modules moved into packages
    # (an old file), or where it is re-exported; the same object, so the same trust (and a class imported into
    # a trusted module is judged as what it is)
    if real in TRUSTED_TYPES:
        return True
    if real.split(".")[0] not in packages:
        return False
    if isinstance(obj, type):
        if real.startswith("gpunets."):
            return _in(obj.__module__, GPUNETS_DATA_PACKAGES)
        if real.startswith("numpy."):
            return _numpy_data_class(obj)
        return True   # scikit-learn's classes (its file-touching packages are in NEVER)
    # a function is called when the network runs, so only those gpunets marks
    return real.startswith("gpunets.") and getattr(obj, "__gn_saved_operation__", False) is True


def is_metric(name: str) -> bool:
    """A public metric of ``sklearn.metrics`` (what a search's scorer calls)."""
    if not name.startswith("sklearn.metrics."):
        return False
    import sklearn.metrics

    obj = resolve(name)
    return (callable(obj) and not isinstance(obj, type)
            and getattr(sklearn.metrics, getattr(obj, "__name__", ""), None) is obj)


def checked_arguments(fn: Any) -> dict[int, str]:
    """The arguments a dispatching operation looks up or calls (``saved_operation(checked=...)``), else ``{}``."""
    checked = getattr(fn, "__gn_checked_arguments__", None)
    return dict(checked) if isinstance(checked, dict) else {}


def is_dispatching(fn: Any) -> bool:
    """Whether ``fn`` calls what its arguments name (a method, a kernel, a callable): checked when loaded."""
    return isinstance(fn, (types.FunctionType, types.BuiltinFunctionType)) and bool(checked_arguments(fn))
