"""Small estimators used by the tests (picklable: defined at module level)."""

import os
import subprocess
import sys
import threading

import numpy as np
from sklearn.base import BaseEstimator, RegressorMixin, TransformerMixin

FIT_COUNTS: dict = {}


def on_a_real_gpu() -> bool:
    """Whether device="auto" runs on a real GPU here. The fake GPU computes with NumPy, so there (and on the host)
    results equal scikit-learn's bit for bit; CuPy and cuML round differently, in the last bits."""
    from gpunets.devices._gpulibs import fake_gpu_count
    from gpunets.devices.placement import gpu_available

    return gpu_available() and not fake_gpu_count()


def as_sklearn_rtol(host: float = 0.0) -> float:
    """The relative tolerance of a comparison with scikit-learn: ``host`` on the CPU and the fake GPU, 1e-10 where
    device="auto" is a real GPU (differences of a few ulps, seen at 4e-15 on an H200)."""
    return max(host, 1e-10) if on_a_real_gpu() else host
_LOCK = threading.Lock()


class FeatureSelector(BaseEstimator, TransformerMixin):
    """Keep the columns listed in ``features`` (all when None)."""

    def __init__(self, features=None):
        self.features = features

    def fit(self, X, y=None):
        self.features_ = list(range(np.asarray(X).shape[1])) if self.features is None else list(self.features)
        return self

    def transform(self, X):
        if hasattr(X, "iloc"):
            return X.iloc[:, self.features_]
        return np.asarray(X)[:, self.features_]


class TargetStandardizer(BaseEstimator, TransformerMixin):
    """Standardise a 1-D target; ``inverse_transform`` undoes it."""

    def __init__(self, shift=0.0):
        self.shift = shift

    def fit(self, y, _=None):
        y = np.asarray(y, dtype=float)
        self.mean_, self.std_ = y.mean() + self.shift, y.std() or 1.0
        return self

    def transform(self, y):
        return (np.asarray(y, dtype=float) - self.mean_) / self.std_

    def inverse_transform(self, z):
        return np.asarray(z) * self.std_ + self.mean_


class Counting(BaseEstimator, RegressorMixin):
    """Ridge-like least squares that counts its fits under ``tag``; can be told to fail."""

    def __init__(self, tag="c", alpha=1.0, fail=False, fail_predict=False):
        self.tag, self.alpha, self.fail, self.fail_predict = tag, alpha, fail, fail_predict

    def fit(self, X, y):
        if self.fail:
            raise ValueError(f"planted failure in {self.tag}")
        X = np.asarray(X, dtype=float)
        y = np.asarray(y, dtype=float)
        A = X.T @ X + self.alpha * np.eye(X.shape[1])
        self.coef_ = np.linalg.solve(A, X.T @ y)
        with _LOCK:
            FIT_COUNTS[self.tag] = FIT_COUNTS.get(self.tag, 0) + 1
        return self

    def predict(self, X):
        if self.fail_predict:
            raise RuntimeError(f"planted predict failure in {self.tag}")
        return np.asarray(X, dtype=float) @ self.coef_


class NoFit:
    def predict(self, X):
        return X


class NetModel(BaseEstimator, RegressorMixin):
    """A model whose fit trains a gpunets network of its own (two branches averaged).

    ``inner`` models may themselves be NetModels: networks inside networks.
    """

    def __init__(self, first=None, second=None, executor="serial", workers=2):
        self.first, self.second, self.executor, self.workers = first, second, executor, workers

    def _net(self, X, y):
        import gpunets as gn
        from sklearn.linear_model import Ridge

        Xs, ys = gn.source(X, name="X"), gn.source(y, name="y")
        a = gn.machine(self.first if self.first is not None else Ridge(alpha=1.0), Xs, ys)
        b = gn.machine(self.second if self.second is not None else Ridge(alpha=3.0), Xs, ys)
        return gn.mean(a.predict(Xs), b.predict(Xs))

    def fit(self, X, y):
        self.net_ = self._net(X, y)
        self.net_.fit(executor=self.executor, workers=self.workers)
        return self

    def predict(self, X):
        return self.net_(X, executor=self.executor, workers=self.workers)


class CountingScaler(BaseEstimator, TransformerMixin):
    """Centre the columns; the fitted estimator counts its own ``fit``/``fit_transform`` calls and
    ``TRANSFORM_CALLS[tag]`` counts ``transform`` calls (in this process)."""

    def __init__(self, tag="t"):
        self.tag = tag

    def fit(self, X, y=None):
        self.mean_ = np.asarray(X, dtype=float).mean(axis=0)
        self.n_fit_ = getattr(self, "n_fit_", 0) + 1
        return self

    def fit_transform(self, X, y=None):
        self.mean_ = np.asarray(X, dtype=float).mean(axis=0)
        self.n_fit_transform_ = getattr(self, "n_fit_transform_", 0) + 1
        return np.asarray(X, dtype=float) - self.mean_

    def transform(self, X):
        with _LOCK:
            TRANSFORM_CALLS[self.tag] = TRANSFORM_CALLS.get(self.tag, 0) + 1
        return np.asarray(X, dtype=float) - self.mean_


TRANSFORM_CALLS: dict = {}


def run_in_the_lane(test_file: str) -> None:
    """Run ``tests/<test_file>`` in a fresh process with the fake-GPU lane's environment and assert it passes.

    Array-API dispatch needs ``SCIPY_ARRAY_API=1`` before SciPy is imported, so the tests of a file whose
    estimators must run on the fake GPU skip themselves elsewhere and run through this instead."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, GPUNETS_FAKE_GPU="1", SCIPY_ARRAY_API="1", CUPY_CUDA_PER_THREAD_DEFAULT_STREAM="1",
               PYTHONPATH=os.pathsep.join([root, os.environ.get("PYTHONPATH", "")]))
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider",
                          os.path.join(root, "tests", test_file)],
                         capture_output=True, text=True, env=env, timeout=900, cwd=root)
    assert out.returncode == 0, (out.stdout + out.stderr)[-4000:]
    assert " passed" in out.stdout and " failed" not in out.stdout and "error" not in out.stdout.splitlines()[-1]
