#!/usr/bin/env bash
# The GPU checks a short lease can afford, in one command, for a machine with a GPU and no
# network: build pyalloc (no build isolation), compile the torch shim once, run the GPU
# tests (pytest -m gpu, four at a time: each is its own process), then the registry's
# profile on ResNet-50 and GPT-2 small (step time with and without the registry, and under
# recompute at half the peak). Everything is written under OUTDIR.
# Usage: tools/gpu_checks.sh OUTDIR [PYTEST ARGS...]
set -uo pipefail
out=${1:?usage: tools/gpu_checks.sh OUTDIR [PYTEST ARGS...]}
shift
mkdir -p "$out"
export PYTHONUNBUFFERED=1
t0=$SECONDS
python3 -m pip install -q --no-build-isolation --no-deps . > "$out/install.log" 2>&1 \
  || { tail -30 "$out/install.log"; exit 1; }
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 -c "import torch; print('torch', torch.__version__)"; date -u; } | tee "$out/device.txt"
python3 -c "from pyalloc import _torch_shim; _torch_shim.load(); print('shim built')" \
  > "$out/shim.log" 2>&1 || { tail -30 "$out/shim.log"; exit 1; }
echo "built in $((SECONDS - t0)) s"
(cd tests && timeout 240 python3 -m pytest -q -m gpu -n 4 -rs --durations=8 "${@:-test_gpu.py}") \
  > "$out/gpu_tests.log" 2>&1
tail -40 "$out/gpu_tests.log"
echo "tests done at $((SECONDS - t0)) s"
for task in resnet50 gpt2; do
  timeout 85 python3 -m pyalloc.bench.profile_registry --device cuda --task "$task" \
    --fraction 0.5 --steps 3 2>&1 | tee -a "$out/profile_registry.txt"
done
echo "all done at $((SECONDS - t0)) s"
