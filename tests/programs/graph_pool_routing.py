"""pyalloc/graphs.py's bookkeeping on the simulated device, where CUDA graphs themselves
cannot run: the torch._C calls cudagraph trees and use_mem_pool make route the calling
thread's allocations to the pool; holds are counted as PyTorch counts them; the pool's
memory joins the cache once nothing holds it. Run by tests/test_graph_pools.py; prints ok.
"""
from __future__ import annotations

import torch

import pyalloc
from pyalloc import graphs, state

pyalloc.install(device="cpu", budget="64MiB")
engine = state.engine()
MiB = 1 << 20
pool = (0, 7)   # a MempoolId_t, as torch.cuda.graph_pool_handle() makes them
number = graphs._number(pool)
assert graphs._number((0, 7)) == number and graphs._number((0, 8)) != number

graphs._begin_thread(0, pool)          # _cuda_beginAllocateCurrentThreadToPool, held once
inside = torch.empty(4 * MiB, dtype=torch.uint8)
graphs._end(0, pool)                   # _cuda_endAllocateToPool
outside = torch.empty(4 * MiB, dtype=torch.uint8)
assert engine.graph_pool_blocks(number) == [inside.data_ptr()]
assert graphs._check_live(0, pool, [inside.data_ptr()])        # _cuda_checkPoolLiveAllocations
assert not graphs._check_live(0, pool, [outside.data_ptr()])
assert graphs._checkpoint_state(0, pool) == (number, frozenset([inside.data_ptr()]))
try:
    graphs._set_checkpoint_state(0, None, [], [])
except RuntimeError as exc:
    assert "max-autotune-no-cudagraphs" in str(exc), exc
else:
    raise AssertionError("rewinding a pool did not refuse")

ptr = inside.data_ptr()
graphs._begin_thread(0, pool)          # a second hold (another warm-up)
graphs._end(0, pool)
del inside
again = torch.empty(4 * MiB, dtype=torch.uint8)
assert again.data_ptr() != ptr, "memory of a held pool served a request outside it"
graphs._release(0, pool)               # one hold left: still the pool's
engine.empty_cache()
held = torch.empty(4 * MiB, dtype=torch.uint8)
assert held.data_ptr() != ptr, "memory of a held pool served a request outside it"
graphs._release(0, pool)               # nothing holds it: it joins the cache
engine.empty_cache()
joined = torch.empty(4 * MiB, dtype=torch.uint8)   # best fit: the pool's 4 MiB hole
assert joined.data_ptr() == ptr, (hex(joined.data_ptr()), hex(ptr))
del outside, again, held, joined
pyalloc.check_invariants()
print("ok")
