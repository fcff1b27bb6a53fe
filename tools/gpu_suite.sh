#!/usr/bin/env bash
# The GPU checks in one command, for a machine with a GPU and no network: build pyalloc
# (no build isolation, so no download), run the GPU tests and the PyTorch tests, the long
# stress run, the allocator benchmark on the GPU and on the simulated device, and the demo.
# Everything is written under OUTDIR.  Usage: tools/gpu_suite.sh OUTDIR
set -uo pipefail
out=${1:?usage: tools/gpu_suite.sh OUTDIR}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-build-isolation --no-deps . > "$out/install.log" 2>&1 \
  || { tail -30 "$out/install.log"; exit 1; }
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 -c "import torch, platform; print('torch', torch.__version__, '| cpu', platform.processor())"
  lscpu | grep 'Model name'; c++ --version | head -1; date -u; } | tee "$out/device.txt"
python3 -X faulthandler -c "import torch, pyalloc; e = pyalloc.Engine('host'); print('smoke: engine ok,', e.stats()['budget_bytes'], 'bytes')" \
  || { echo "smoke check failed"; exit 1; }
(cd tests && python3 -m pytest -q -rs test_gpu.py test_torch_sim.py test_trace_replay.py test_evictor.py) 2>&1 \
  | tee "$out/tests.log" | tail -15
python3 - <<'PY' 2>&1 | tee "$out/stress.log"
import time, pyalloc
t = time.time()
with pyalloc.Engine("host", budget="1GiB") as e:
    e.stress(threads=16, ops=2_000_000, seed=1, max_size=32 << 20, check_every=20_000)
print(f"stress: 2,000,000 ops on 16 threads, clean, {time.time() - t:.1f} s")
PY
pyalloc-demo --steps 20 --out "$out/demo" --json "$out/demo_gpu.json" 2>/dev/null \
  | grep -v "^  0x" | head -40
pyalloc-stats export-memviz "$out/demo/trace.json.gz" -o "$out/demo/memviz.pickle" && echo "memviz export ok"
python3 tools/replay.py "$out/demo/trace.json.gz" | head -12
# The allocator benchmark: the synthetic mix, and the demo's own training trace replayed.
python3 tools/bench_alloc.py --trace "$out/demo/trace.json.gz" --json "$out/bench_alloc_gpu.json" \
  2>&1 | tail -7
python3 tools/bench_alloc.py --device cpu --trace "$out/demo/trace.json.gz" \
  --json "$out/bench_alloc_sim.json" 2>&1 | tail -5
# Expandable segments (option expandable): the same trace, to weigh their mapping cost on
# the GPU against the default layout's before either becomes the default.
python3 tools/bench_alloc.py --trace "$out/demo/trace.json.gz" --options expandable:true \
  --json "$out/bench_alloc_gpu_expandable.json" 2>&1 | tail -7
