#!/usr/bin/env bash
# Kernel checks for a machine with an NVIDIA GPU (written for an H200): the decode
# benchmark with a tile sweep (the Triton kernel against SDPA on contiguous K/V), the
# torch path against SDPA and the reference, then the kernel tests compiled for the GPU. Installs
# nothing: it uses the machine's own python3, torch and triton. Full results go under
# $OUT (default build/gpu-check); a short summary is printed last.
#
#   OUT=/path/to/results bench/gpu_check.sh [--quick]
#
# Budget: about 5 minutes on an H200 (benchmark ~2, torch path ~1, tests ~2); each stage
# has its own timeout so that a slow stage cannot take the others' results with it.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-build/gpu-check}"
PY="${PYTHON:-python3}"
QUICK=()
if [[ "${1:-}" == "--quick" ]]; then QUICK=(--quick); fi
mkdir -p "$OUT"

{
  date -u
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm,clocks.max.mem \
    --format=csv 2>&1
  "$PY" -c 'import torch, triton
print("versions: python", __import__("sys").version.split()[0], "torch", torch.__version__,
      "cuda", torch.version.cuda, "triton", triton.__version__)
p = torch.cuda.get_device_properties(0)
print("gpu:", p.name, p.multi_processor_count, "SMs,", p.total_memory >> 30, "GiB")'
} > "$OUT/env.txt" 2>&1

# Benchmark first: it is what only this machine can measure.
timeout 270 "$PY" bench/kernel.py --device cuda --sweep "${QUICK[@]}" \
  --out "$OUT/bench.json" > "$OUT/bench.txt" 2>&1
bench_rc=$?

timeout 120 "$PY" bench/torch_path.py --device cuda --quick --shapes realistic \
  --out "$OUT/torch_path.json" > "$OUT/torch_path.txt" 2>&1
torch_rc=$?

# Tests: CUDA shapes run compiled; the interpreter tests use CPU tensors on the same machine.
timeout 300 "$PY" -m pytest tests/test_kernels.py tests/test_kernel_checks.py \
  tests/test_kernel_syncs.py tests/test_kernel_variants.py -q -p no:cacheprovider --durations=10 \
  --junitxml="$OUT/junit.xml" > "$OUT/tests.txt" 2>&1
tests_rc=$?

echo "== environment"
grep -E "^(versions|gpu):" "$OUT/env.txt"
echo "== kernel tests (exit $tests_rc; 124 = timed out): $OUT/tests.txt"
grep -E "^(FAILED|ERROR)" "$OUT/tests.txt" | head -20
tail -n 1 "$OUT/tests.txt"
echo "== torch path (exit $torch_rc; 124 = timed out): $OUT/torch_path.txt"
sed -n '/^summary:/,$p' "$OUT/torch_path.txt" | tail -n 12
echo "== benchmark (exit $bench_rc; 124 = timed out): $OUT/bench.txt, $OUT/bench.json"
if grep -q "^summary:" "$OUT/bench.txt"; then
  sed -n '/^summary:/,$p' "$OUT/bench.txt"
else
  tail -n 30 "$OUT/bench.txt"
fi
exit $(( bench_rc != 0 || tests_rc != 0 || torch_rc != 0 ))
