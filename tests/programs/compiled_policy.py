"""torch.compile under a policy (pyalloc/compiled.py), on the simulated device.

Run by tests/test_compiled.py in a fresh interpreter (install() is once a process):
    python tests/programs/compiled_policy.py POLICY BUDGET
POLICY: none, recompute or swap. Trains an MLP whose four blocks are compiled separately,
with an eager op between them, so the registry evicts what the eager ops make while the
compiled regions read it; then calls a compiled function on a tensor the registry has
evicted (read through its data pointer, it was a crash before the regions held their
tensors). Prints one JSON object: the losses, the parameters' digest and the counters.
"""
import hashlib
import json
import sys

import torch

import pyalloc

policy, budget = sys.argv[1], sys.argv[2]
pyalloc.install(device="cpu", budget=budget, **({} if policy == "none" else {"policy": policy}))
# A compiled function called on a tensor the registry has evicted.
torch.manual_seed(0)
double = torch.compile(lambda t: t * 2 + 1)
w = torch.randn(1024, 1024, requires_grad=True)
x = torch.randn(1024, 1024)
made = torch.tanh(x @ w)    # 4 MiB, a node the registry can rebuild
expect = made.detach() * 2 + 1
pressure = [torch.tanh(x @ w) for _ in range(16)]
evicted_before = pyalloc.memory_stats().get("remat.evictions", 0)
reg = pyalloc.registry.active()
node = reg.node_of(made) if reg is not None else None
made_evicted = bool(node is not None and node.evicted)
same = torch.equal(double(made).detach(), expect)
del double, w, x, made, expect, pressure

torch.manual_seed(0)
layers = []
for _ in range(8):
    layers += [torch.nn.Linear(512, 512), torch.nn.Tanh()]
body = torch.nn.Sequential(*layers)
head = torch.nn.Linear(512, 10)
blocks = [torch.compile(body[i * 4:(i + 1) * 4]) for i in range(4)]
params = list(body.parameters()) + list(head.parameters())
opt = torch.optim.SGD(params, lr=0.01)
x, y = torch.randn(2048, 512), torch.randint(0, 10, (2048,))
losses = []
for step in range(3):
    h = x
    for block in blocks:
        h = block(h) * 1.0   # an eager op between compiled regions
    loss = torch.nn.functional.cross_entropy(head(h), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    losses.append(loss.item())
digest = hashlib.sha256(b"".join(p.detach().numpy().tobytes() for p in params)).hexdigest()
trained = pyalloc.memory_stats()

capture = ""
if policy != "none":
    try:
        torch.cuda.CUDAGraph.capture_begin(None)   # refused before it reaches the device
    except RuntimeError as error:
        capture = str(error)
print(json.dumps({"capture": capture, "losses": losses, "digest": digest, "same": same,
                  "evictions": trained.get("remat.evictions", 0) - evicted_before,
                  "evicted_before_call": evicted_before, "made_evicted": made_evicted}))
