#!/usr/bin/env bash
# The prepared GPU check: the GPU tests and the GPU benchmark sections, in under 5 minutes.
# Needs CuPy, numba-cuda, scikit-learn and pytest; cuDF and cuML are optional (what needs them is skipped,
# and the script says so). Writes $OUT_DIR/gpu_check.json (default benchmarks/results) and exits non-zero on
# any failure.
#   bash benchmarks/gpu_check.sh [OUT_DIR]
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:-benchmarks/results}
mkdir -p "$out"
export PYTHONUNBUFFERED=1 SCIPY_ARRAY_API=1 CUPY_CUDA_PER_THREAD_DEFAULT_STREAM=1
unset NUMBA_ENABLE_CUDASIM
py=${PYTHON:-python3}
status=0
$py - <<'PY' || status=1
import importlib.util, cupy
print("GPU:", cupy.cuda.runtime.getDeviceProperties(0)["name"].decode(), "| devices:", cupy.cuda.runtime.getDeviceCount())
for m in ("cudf", "cuml", "dask_cuda"):
    print(f"{m}: {'installed' if importlib.util.find_spec(m) else 'NOT installed: tests that need it are skipped'}")
PY
# The GPU tests: -m gpu selects them; they are the same tests CI skips.
timeout 170 $py -m pytest -q -m gpu -p no:cacheprovider --junitxml="$out/gpu_tests.xml" tests || status=1
# The GPU benchmark sections (each skips itself without a GPU).
timeout 120 $py - "$out" <<'PY' || status=1
import json, sys, time
sys.path.insert(0, ".")
out = sys.argv[1]
from benchmarks import bench_executors, bench_kernels
res = {"date": time.strftime("%Y-%m-%d %H:%M:%S")}
res["executors_gpu"] = bench_executors.gpu_streams(quick=False, png=f"{out}/executors_gpu_timeline.png")
try:
    res["kernels_gpu"] = bench_kernels.gpu_section() if hasattr(bench_kernels, "gpu_section") else bench_kernels.run(quick=True).get("gpu")
except Exception as e:  # reported, and the script fails
    res["kernels_gpu"] = {"error": repr(e)}
json.dump(res, open(f"{out}/gpu_check.json", "w"), indent=2, default=str)
print(json.dumps(res, indent=2, default=str))
bad = [k for k, v in res.items() if isinstance(v, dict) and "error" in v]
sys.exit(1 if bad else 0)
PY
echo "gpu_check: $([ $status -eq 0 ] && echo PASSED || echo FAILED) (results in $out)"
exit $status
