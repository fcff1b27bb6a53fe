# Untuned: "auto batch size" by catching torch.OutOfMemoryError. A token-mixing MLP with LayerNorm,
# GELU and dropout, AdamW, clip_grad_norm_; every step runs as two accumulated half batches (loss /
# 2 each). Under a pyalloc policy the loop first tries a larger batch (in halves: 2.5x at step 1 and
# 2x at step 2 with grads None; 2.25x at step 3 after the first half has accumulated, the caught
# error - whose traceback holds the failed pass's graph - kept while the halves run and dropped
# before opt.step() (KEEP=1: kept for good); 8x at step 4, then pyalloc.empty_cache()), catches the
# OutOfMemoryError (in forward or in backward, by budget), checks that parameters and optimizer
# state are bit for bit as before the attempt (exit 3 if not) and no registry node is left pinned
# (exit 4), zero_grads, rewinds the CPU RNG and runs the step as halves, as plain PyTorch does
# (where no attempt is made). An attempt that fits is thrown away the same way. A .grad changed by a
# failure in backward (partly accumulated, as PyTorch leaves it) is reported on stderr with the
# number of parameters it touched; the registry's invariants are checked after each OOM. 6 steps.
import hashlib, os, sys, torch, torch.nn as nn, torch.nn.functional as F
from common import setup, report
policy = setup()
torch.use_deterministic_algorithms(True)
B, T, D, C = 64, 128, 128, 10
HALF = B // 2
class Block(nn.Module):
    def __init__(s):
        super().__init__()
        s.n1 = nn.LayerNorm(D); s.tok = nn.Linear(T, T)
        s.n2 = nn.LayerNorm(D); s.ff1 = nn.Linear(D, 2 * D); s.ff2 = nn.Linear(2 * D, D)
        s.drop = nn.Dropout(0.1)
    def forward(s, x):
        x = x + s.tok(s.n1(x).transpose(1, 2)).transpose(1, 2)
        return x + s.drop(s.ff2(F.gelu(s.ff1(s.n2(x)))))
class Net(nn.Module):
    def __init__(s):
        super().__init__()
        s.inp = nn.Linear(32, D)
        s.blocks = nn.Sequential(*[Block() for _ in range(4)])
        s.head = nn.Linear(D, C)
    def forward(s, x):
        return s.head(s.blocks(s.inp(x)).mean(1))
model = Net()
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
managed = policy not in ("plain", "none")
def digest(what):
    h = hashlib.sha256()
    if what == "params":
        for p in model.parameters(): h.update(p.detach().numpy().tobytes())
    elif what == "grads":
        for p in model.parameters(): h.update(b"none" if p.grad is None else p.grad.numpy().tobytes())
    else:
        for st in opt.state.values():
            for k in sorted(st): h.update(st[k].numpy().tobytes())
    return h.hexdigest()
def run_batch(x, y, scale, phase):
    phase[0] = "forward"
    loss = F.cross_entropy(model(x), y) / scale
    phase[0] = "backward"
    loss.backward()
    phase[0] = "done"
    return loss.detach()
g = torch.Generator().manual_seed(1)
attempts = {1: (2.5, "before"), 2: (2, "before"), 3: (2.25, "after_half"), 4: (8, "before")}
losses, kept = [], []
for step in range(6):
    x = torch.randn(B, T, 32, generator=g)
    y = torch.randint(0, C, (B,), generator=g)
    rng0 = torch.get_rng_state()
    opt.zero_grad()
    done = []
    if managed and step in attempts:
        mult, when = attempts[step]
        if when == "after_half": done.append(run_batch(x[:HALF], y[:HALF], 2, [None]))
        before = {k: digest(k) for k in ("params", "grads", "opt")}
        grads0 = [None if p.grad is None else p.grad.numpy().tobytes() for p in model.parameters()]
        xb = torch.randn(int(mult * HALF), T, 32, generator=torch.Generator().manual_seed(100 + step))
        yb = torch.randint(0, C, (int(mult * HALF),), generator=torch.Generator().manual_seed(200 + step))
        phase = [None]
        try:
            run_batch(xb, yb, 1, phase)
            print(f"step {step}: {mult}x half fitted", file=sys.stderr)
        except torch.OutOfMemoryError as e:
            print(f"step {step}: {mult}x half out of memory in {phase[0]}", file=sys.stderr)
            if step == 3: kept.append(e)
            after = {k: digest(k) for k in ("params", "grads", "opt")}
            for k in before:
                if before[k] != after[k]:
                    n = sum(a != (None if p.grad is None else p.grad.numpy().tobytes()) for a, p in zip(grads0, model.parameters())) if k == "grads" else ""
                    print(f"step {step}: {k} CHANGED by the failed attempt ({phase[0]}) {n}", file=sys.stderr)
                    if k != "grads": sys.exit(3)
            from pyalloc import registry
            pins = sum(n.pins for n in registry.active().nodes.values())
            if pins: print(f"step {step}: {pins} pins left after the OOM", file=sys.stderr); sys.exit(4)
            registry.active().check_invariants()
            if step == 4:
                import pyalloc
                pyalloc.empty_cache()
        del xb, yb
        opt.zero_grad()
        torch.set_rng_state(rng0)
        done = []
    for i in range(2):
        sl = slice(i * HALF, (i + 1) * HALF)
        done.append(run_batch(x[sl], y[sl], 2, [None]))
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    if not os.environ.get("KEEP"): kept.clear()
    opt.step()
    losses.extend(done)
opt.zero_grad()
report(policy, [model], losses)
