#!/usr/bin/env bash
# The prepared GPU check: an NVVM probe, the GPU tests twice (without and with CuPy's per-thread default
# stream, as users run them) and the GPU benchmark sections, in under 5 minutes on one GPU.
# Needs CuPy, numba-cuda, scikit-learn and pytest; cuDF, cuML and dask are optional (what needs them is
# skipped, and the script says so). Writes $OUT_DIR/gpu_check.json (default benchmarks/results) after every
# section, so a run cut short still leaves what it found; exits non-zero on any failure.
#   bash benchmarks/gpu_check.sh [OUT_DIR]
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:-benchmarks/results}
mkdir -p "$out"
export PYTHONUNBUFFERED=1 SCIPY_ARRAY_API=1
unset NUMBA_ENABLE_CUDASIM CUPY_CUDA_PER_THREAD_DEFAULT_STREAM
py=${PYTHON:-python3}
json="$out/gpu_check.json"
status=0
echo '{}' > "$json"

# save SECTION: merge the JSON object on stdin into $json under SECTION (the file is complete after each call)
save() {
  $py -c '
import json, sys, time
path, key = sys.argv[1], sys.argv[2]
try:
    res = json.load(open(path))
except (OSError, ValueError):
    res = {}
raw = sys.stdin.read()
try:
    res[key] = json.loads(raw)
except ValueError:
    res[key] = {"error": "unreadable section output", "raw": raw[-2000:]}
res["updated"] = time.strftime("%Y-%m-%d %H:%M:%S")
json.dump(res, open(path, "w"), indent=2, default=str)
' "$json" "$1"
}

# 0. CUDA_HOME for NVVM (numba-cuda compiles through libNVVM): the system toolkit, else the pip wheel
if [ -z "${CUDA_HOME:-}" ]; then
  if [ -d /usr/local/cuda/nvvm ]; then
    export CUDA_HOME=/usr/local/cuda
  else
    nvcc_dir=$($py -c 'import nvidia.cuda_nvcc as m, os; print(os.path.dirname(m.__file__))' 2>/dev/null \
               || $py -c 'import nvidia.cuda_nvcc as m; print(list(m.__path__)[0])' 2>/dev/null || true)
    [ -n "$nvcc_dir" ] && [ -d "$nvcc_dir" ] && export CUDA_HOME="$nvcc_dir"
  fi
fi
echo "CUDA_HOME=${CUDA_HOME:-<unset>}"

# 1. environment and the one-line NVVM probe (compile_ptx needs NVVM, not a GPU)
timeout 60 $py - <<'PY' | save environment || status=1
import importlib.util, json, os, sys
info = {"CUDA_HOME": os.environ.get("CUDA_HOME")}
ok = True
try:
    import cupy
    info.update(gpu=cupy.cuda.runtime.getDeviceProperties(0)["name"].decode(),
                devices=cupy.cuda.runtime.getDeviceCount(), cupy=cupy.__version__)
except Exception as e:  # noqa: BLE001
    info["cupy_error"] = repr(e); ok = False
try:
    import numba
    from numba import cuda
    info["numba"] = numba.__version__
    info["numba_cuda_available"] = bool(cuda.is_available())
    def probe(a):
        a[0] = 1.0
    cuda.compile_ptx(probe, "(float32[:],)", cc=(9, 0))
    info["nvvm_probe"] = "ok: compile_ptx for sm_90"
except Exception as e:  # noqa: BLE001
    info["nvvm_probe"] = f"FAILED: {e!r}"; ok = False
for m in ("cudf", "cuml", "rmm", "dask"):
    info[m] = "installed" if importlib.util.find_spec(m) else "NOT installed: what needs it is skipped"
if not ok:
    info["error"] = "CuPy or NVVM unusable (see cupy_error / nvvm_probe)"
print(json.dumps(info))
print({k: v for k, v in info.items()}, file=sys.stderr)
sys.exit(0 if ok else 1)
PY

# 2. the GPU tests (-m gpu: the tests CI skips), without and with CUPY_CUDA_PER_THREAD_DEFAULT_STREAM=1
run_tests() {   # run_tests NAME [ENV=VALUE]
  local name=$1; shift
  env "$@" timeout 100 $py -m pytest -q -rs -m gpu -p no:cacheprovider --continue-on-collection-errors \
      --junitxml="$out/$name.xml" tests
  local rc=$?
  $py - "$out/$name.xml" "$rc" "$*" <<'PY' | save "$name"
import json, sys
import xml.etree.ElementTree as ET
path, rc, env = sys.argv[1], int(sys.argv[2]), sys.argv[3]
t = {"env": env or "(none)", "pytest_exit_code": rc, "passed": rc == 0}
try:
    root = ET.parse(path).getroot()
    suite = root if root.tag == "testsuite" else root.find("testsuite")
    for k in ("tests", "failures", "errors", "skipped"):
        t[k] = int(suite.get(k, 0))
    t["skipped_because"] = sorted({(s.get("message") or "")[:200] for s in root.iter("skipped")})
    t["failed"] = [f"{c.get('classname')}::{c.get('name')}" for c in root.iter("testcase")
                   if c.find("failure") is not None or c.find("error") is not None]
except (OSError, ET.ParseError, AttributeError) as e:
    t["junit_error"] = repr(e)
if rc != 0:
    t["error"] = f"pytest exited with {rc} (124: the timeout; 5: no GPU test collected)"
elif t.get("tests", 0) and t.get("skipped") == t.get("tests"):
    t["error"] = "every GPU test was skipped: no usable GPU seen (see skipped_because)"
print(json.dumps(t))
PY
  return $rc
}
run_tests gpu_tests_legacy_stream || status=1
run_tests gpu_tests_per_thread_stream CUPY_CUDA_PER_THREAD_DEFAULT_STREAM=1 || status=1

# 3. the GPU benchmark sections (each skips itself without a GPU; here a skip is a failure)
for section in executors_gpu kernels_gpu tuning_gpu; do
  timeout 50 $py - "$out" "$section" <<'PY' | save "$section" || status=1
import json, sys, time, traceback
sys.path.insert(0, ".")
out, section = sys.argv[1], sys.argv[2]
from benchmarks import bench_executors, bench_kernels, bench_tuning
run = {"executors_gpu": lambda: bench_executors.gpu_streams(quick=False, png=f"{out}/executors_gpu_timeline.png"),
       "kernels_gpu": lambda: bench_kernels.gpu_section(quick=True),
       # the one-stage search on CuPy data, device="cuda": streams vs serial, scores against the CPU (< 40 s)
       "tuning_gpu": lambda: bench_tuning.gpu_search(rows=50_000)}[section]
t0 = time.perf_counter()
try:
    res = run()
except Exception as e:  # noqa: BLE001 - reported, and the script fails
    res = {"error": repr(e), "traceback": traceback.format_exc()}
res["wall_seconds"] = round(time.perf_counter() - t0, 2)
if "skipped" in res:
    res["error"] = f"skipped: {res['skipped']}"
print(json.dumps(res, default=str))
print(section, json.dumps(res, indent=2, default=str), file=sys.stderr)
sys.exit(1 if "error" in res else 0)
PY
done

# 4. several GPUs (only with 2 or more): dask-cuda's LocalCUDACluster, one worker per GPU; each cuda:N
#    placement runs on the worker owning GPU N, fitted states stay there (tests/test_dask.py -k cuda_cluster)
n_gpus=$($py -c 'import cupy; print(cupy.cuda.runtime.getDeviceCount())' 2>/dev/null || echo 0)
if [ "${n_gpus:-0}" -ge 2 ]; then
  timeout 150 $py -m pytest -q -rs -p no:cacheprovider tests/test_dask.py -k cuda_cluster \
      --junitxml="$out/multi_gpu.xml"
  rc=$?
  echo "{\"gpus\": $n_gpus, \"pytest_exit_code\": $rc$([ $rc -ne 0 ] && echo ', "error": "multi-GPU dask tests failed (5: none collected, 124: timeout)"')}" \
    | save multi_gpu_dask
  [ $rc -eq 0 ] || status=1
else
  echo "{\"skipped\": \"$n_gpus GPU(s): the multi-GPU section needs 2 or more\"}" | save multi_gpu_dask
fi

$py -c 'import json, sys; r = json.load(open(sys.argv[1])); bad = [k for k, v in r.items() if isinstance(v, dict) and "error" in v]; print("failed sections:", ", ".join(bad) or "none")' "$json"
echo "gpu_check: $([ $status -eq 0 ] && echo PASSED || echo FAILED) (results in $json)"
exit $status
