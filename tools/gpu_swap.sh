#!/usr/bin/env bash
# The swap benchmark on a GPU, for a machine with no network: build pyalloc (no build
# isolation), then tools/bench_swap.py on CUDA with an 8 GiB pinned host pool (the automatic
# size pins up to a quarter of RAM in every process). Usage: tools/gpu_swap.sh OUTDIR [TASKS...]
set -uo pipefail
out=${1:?usage: tools/gpu_swap.sh OUTDIR [TASKS...]}
shift
tasks=${*:-cnn transformer resnet50}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-build-isolation --no-deps . > "$out/install.log" 2>&1 \
  || { tail -30 "$out/install.log"; exit 1; }
# shellcheck disable=SC2086
python3 tools/bench_swap.py --device cuda --tasks $tasks --host-pool $((8 << 30)) \
  --out "$out" 2>&1 | tail -60
