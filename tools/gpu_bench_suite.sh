#!/usr/bin/env bash
# The head-to-head benchmark suite on a GPU, for a machine with no network: build pyalloc
# (no build isolation), then tools/bench_suite.py on CUDA (resnet50, gpt2, unet_gpu; stock,
# expandable, checkpoint, recompute, swap, hybrid; swap and hybrid with an 8 GiB pinned host
# pool). Stops itself after --max-minutes (10 by default). Usage: tools/gpu_bench_suite.sh
# OUTDIR [more bench_suite.py arguments, e.g. --quick or --tasks resnet50]
set -uo pipefail
out=${1:?usage: tools/gpu_bench_suite.sh OUTDIR [ARGS...]}
shift
mkdir -p "$out"
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-build-isolation --no-deps . > "$out/install.log" 2>&1 \
  || { tail -30 "$out/install.log"; exit 1; }
python3 -c "import pyalloc._lib as l; assert l.lib().pyalloc_has_cuda_backend(), 'no CUDA backend'" \
  || exit 1
python3 tools/bench_suite.py --device cuda --out "$out" "$@" 2>&1 | tail -40
