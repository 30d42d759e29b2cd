"""Import scikit-learn compositions as gpunets networks: :func:`from_sklearn`.

One module per kind of composition (:mod:`.pipeline`, :mod:`.columns` for
``ColumnTransformer``/``FeatureUnion``, :mod:`.ensembles` for voting and
stacking, :mod:`.target` for ``TransformedTargetRegressor``, :mod:`.forests` for
random and extra-trees forests split into chunks of trees), the dispatch in
:mod:`._base`, the composites in :mod:`.composite`.  Importing this package
imports scikit-learn but none of cupy, cudf, cuml, numba or dask.
"""

from gpunets.sklearn_import.composite import (
    FromSklearnClassifier,
    FromSklearnRegressor,
    FromSklearnTransformer,
)
from gpunets.sklearn_import.convert import from_sklearn

__all__ = ["FromSklearnClassifier", "FromSklearnRegressor", "FromSklearnTransformer", "from_sklearn"]
