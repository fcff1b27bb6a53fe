# Was a pyalloc bug (fixed: a written parameter freezes, dispatch.cpp run_op): an ensemble trained with torch.func (stack_module_state + vmap(grad(...)) with the
# per-member gradients assigned to the stacked leaves' .grad, Adam), then the stacked parameters
# copied back into the member modules under no_grad (p.copy_(params[n][i])). Under swap/hybrid
# at 180 MiB the copy_ into a member's parameter (an input of the aten::stack node that made the
# stacked leaf) fails with
#   RuntimeError: pyalloc: cannot recompute a tensor: its input was modified in place after it
#   was recorded (version 3, recorded 2). This is a registry bug; please report it.
# Plain PyTorch runs it. The stacked leaves 3.weight and 8.weight stay evictable registry nodes
# (op aten::stack., chain 1 + one link per Adam step, not frozen/fixed) since no AccumulateGrad
# ever touches them (the grads are assigned, not accumulated).
#   python func_ensemble.py {plain,swap,hybrid,recompute} [BUDGET]   (default 180 MiB)
import sys, copy, torch, torch.nn as nn, torch.nn.functional as F
from torch.func import stack_module_state, functional_call, vmap, grad
policy = sys.argv[1]; BUDGET = int(sys.argv[2]) if len(sys.argv) > 2 else 180 << 20
if policy != "plain":
    import pyalloc
    pyalloc.install(device="cpu", budget=BUDGET, policy=policy, **({"host_pool": "1GiB"} if policy != "recompute" else {}))
torch.manual_seed(0)
M, B, C = 4, 32, 10
def make():
    return nn.Sequential(nn.Conv2d(3, 32, 3, padding=1), nn.GroupNorm(1, 32), nn.ReLU(),
                         nn.Conv2d(32, 32, 3, padding=1), nn.GroupNorm(1, 32), nn.ReLU(), nn.MaxPool2d(4),
                         nn.Flatten(), nn.Linear(32 * 8 * 8, C))
models = [make() for _ in range(M)]
params, buffers = stack_module_state(models)
base = copy.deepcopy(models[0]).to("meta")
def member_loss(p, x, y): return F.cross_entropy(functional_call(base, p, (x,)), y)
gv = vmap(grad(member_loss), in_dims=(0, None, None))
opt = torch.optim.Adam(params.values(), lr=1e-3)
g = torch.Generator().manual_seed(1)
for step in range(3):
    x = torch.randn(B, 3, 32, 32, generator=g); y = torch.randint(0, C, (B,), generator=g)
    grads = gv(params, x, y)
    for k, p in params.items(): p.grad = grads[k]
    opt.step()
with torch.no_grad():
    for i, m in enumerate(models):
        for n, p in m.named_parameters(): p.copy_(params[n][i])
print([float(p.double().square().sum()).hex() for m in models for p in m.parameters()])
