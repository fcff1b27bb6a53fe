# Untuned: steps that fail halfway and are run again. A pre-norm MLP-mixer-style net with dropout
# and a custom autograd.Function (a clamped SiLU with a hand-written backward) in each block, AdamW,
# 10 steps; a failed step is caught, opt.zero_grad() runs and the same batch is run again (dropout
# draws on). Step 2: a tensor hook on the output of block 1 raises a custom exception in the middle
# of backward (the exception, whose traceback holds the graph, kept until the end). Step 4: a
# forward hook on block 2 raises halfway through forward. Step 6: the Function's backward raises
# ValueError in block 0 (the last of backward). Step 7: a tensor hook in the middle of backward
# calls registry.active().interrupt() under a policy, so the next op raises RuntimeError "pyalloc:
# interrupted" (under plain and none the hook raises that error itself). Step 8: the same from a
# forward hook in the middle of forward. Step 9: interrupt() then interrupt(False) (withdrawn:
# nothing raises). Under a policy, after each failure: no node pinned (exit 4), the registry's
# invariants hold, and the parameters and optimizer state are as before (exit 3).
import hashlib, sys, torch, torch.nn as nn, torch.nn.functional as F
from common import setup, report
policy = setup()
torch.use_deterministic_algorithms(True)
reg = None
if policy not in ("plain", "none"):
    from pyalloc import registry
    reg = registry.active()
class BadGradient(Exception): pass
class SkipBatch(Exception): pass
fail = {"fn_bwd": False, "hook_bwd": False, "fwd": False, "int_bwd": False, "int_fwd": False}
class ClampedSiLU(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, idx):
        ctx.save_for_backward(x); ctx.idx = idx
        return F.silu(x).clamp(max=6.0)
    @staticmethod
    def backward(ctx, g):
        if fail["fn_bwd"] and ctx.idx == 0: raise ValueError("bad backward in block 0")
        x, = ctx.saved_tensors
        s = torch.sigmoid(x)
        return g * (s * (1 + x * (1 - s))) * (F.silu(x) < 6.0), None
B, T, D = 48, 64, 192
class Block(nn.Module):
    def __init__(s, i):
        super().__init__(); s.i = i
        s.n1 = nn.LayerNorm(D); s.tok = nn.Linear(T, T)
        s.n2 = nn.LayerNorm(D); s.f1 = nn.Linear(D, 3 * D); s.f2 = nn.Linear(3 * D, D)
        s.drop = nn.Dropout(0.1)
    def forward(s, x):
        x = x + s.tok(s.n1(x).transpose(1, 2)).transpose(1, 2)
        return x + s.drop(s.f2(ClampedSiLU.apply(s.f1(s.n2(x)), s.i)))
class Net(nn.Module):
    def __init__(s):
        super().__init__()
        s.inp = nn.Linear(16, D); s.blocks = nn.ModuleList([Block(i) for i in range(4)])
        s.head = nn.Linear(D, 5)
    def forward(s, x):
        h = s.inp(x)
        for i, b in enumerate(s.blocks):
            h = b(h)
            if i == 1 and h.requires_grad: h.register_hook(mid_hook)
        return s.head(h.mean(1))
def mid_hook(grad):
    if fail["hook_bwd"]: raise BadGradient("bad gradient at block 1")
    if fail["int_bwd"]: interrupt()
    return grad
def interrupt():
    if reg is not None: reg.interrupt()
    else: raise RuntimeError("pyalloc: interrupted (raised by the program under plain PyTorch)")
def fwd_hook(m, i, o):
    if fail["fwd"]: raise SkipBatch("skip in block 2")
    if fail["int_fwd"]: interrupt()
model = Net()
model.blocks[2].register_forward_hook(fwd_hook)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
def digest():
    h = hashlib.sha256()
    for p in model.parameters(): h.update(p.detach().numpy().tobytes())
    for st in opt.state.values():
        for k in sorted(st): h.update(st[k].numpy().tobytes())
    return h.hexdigest()
plan = {2: "hook_bwd", 4: "fwd", 6: "fn_bwd", 7: "int_bwd", 8: "int_fwd"}
g = torch.Generator().manual_seed(1)
losses, errors = [], []
for step in range(10):
    x = torch.randn(B, T, 16, generator=g); y = torch.randint(0, 5, (B,), generator=g)
    for attempt in range(2):
        for k in fail: fail[k] = attempt == 0 and plan.get(step) == k
        if step == 9 and reg is not None and attempt == 0: reg.interrupt(); reg.interrupt(False)
        before = digest()
        try:
            loss = F.cross_entropy(model(x), y)
            loss.backward()
        except (BadGradient, SkipBatch, ValueError, RuntimeError) as e:
            if isinstance(e, RuntimeError) and "pyalloc: interrupted" not in str(e): raise
            print(f"step {step}: {type(e).__name__}: {str(e)[:60]}", file=sys.stderr)
            if step == 2: errors.append(e)
            losses.append(torch.tensor(-1.0 - step))
            opt.zero_grad()
            if reg is not None:
                if sum(n.pins for n in reg.nodes.values()): print("pins left", file=sys.stderr); sys.exit(4)
                reg.check_invariants()
            if digest() != before: print(f"step {step}: state CHANGED", file=sys.stderr); sys.exit(3)
            continue
        break
    opt.step(); opt.zero_grad()
    losses.append(loss.detach())
    del loss
losses.append(torch.tensor(float(len(errors))))
report(policy, [model], losses)
