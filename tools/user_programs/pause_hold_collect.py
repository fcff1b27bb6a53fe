# Untuned: a training loop that calls pyalloc's own API around ordinary PyTorch. A small conv net
# (BatchNorm, SiLU, a residual stage) with a forward hook keeping a middle activation `feat`, AdamW,
# 6 steps. Every step reads pyalloc.memory_stats() and the registry's stats() (logged, not
# reported); a holding([feat, logits]) block reads both through APIs that take no data_ptr (.item(),
# .tolist(), indexing, norms, a Gram matrix that allocates while they are pinned; on odd steps
# backward runs inside the block too); after opt.step() registry.collect() runs, and on step 3
# restore_all(), check_invariants(), pyalloc.snapshot() and pyalloc.empty_cache(). Every other step
# a validation pass runs under registry.paused() in eval mode and no_grad, which also reads the kept
# `feat` of the previous step inside holding([feat]) (PAUSED_FEAT=bare: without holding; under swap
# and hybrid that read finds it swapped out and raises the evicted-memory RuntimeError). Under plain
# and none the registry calls are skipped; the results must not depend on them.
import contextlib, os, sys, torch, torch.nn as nn, torch.nn.functional as F
from common import setup, report
policy = setup()
torch.use_deterministic_algorithms(True)
reg = None
if policy != "plain":
    import pyalloc
    from pyalloc import registry
    reg = registry.active()
def conv_bn(i, o, s=1):
    return nn.Sequential(nn.Conv2d(i, o, 3, s, 1, bias=False), nn.BatchNorm2d(o), nn.SiLU())
class Res(nn.Module):
    def __init__(s, c):
        super().__init__(); s.a = conv_bn(c, c); s.b = conv_bn(c, c)
    def forward(s, x): return x + s.b(s.a(x))
class Net(nn.Module):
    def __init__(s):
        super().__init__()
        s.stem = conv_bn(3, 32)
        s.stage1 = nn.Sequential(Res(32), Res(32))
        s.down = conv_bn(32, 64, 2)
        s.stage2 = nn.Sequential(Res(64), Res(64))
        s.head = nn.Linear(64, 10)
    def forward(s, x):
        x = s.stage2(s.down(s.stage1(s.stem(x))))
        return s.head(x.mean((2, 3)))
model = Net()
kept = {}
model.stage1.register_forward_hook(lambda m, i, o: kept.__setitem__("feat", o))
opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.05)
g = torch.Generator().manual_seed(1)
xv = torch.randn(16, 3, 32, 32, generator=g); yv = torch.randint(0, 10, (16,), generator=g)
hold = (lambda ts: reg.holding(ts)) if reg is not None else (lambda ts: contextlib.nullcontext())
pause = (lambda: reg.paused()) if reg is not None else contextlib.nullcontext
losses, log = [], []
feat_prev = None
for step in range(6):
    x = torch.randn(32, 3, 32, 32, generator=g); y = torch.randint(0, 10, (32,), generator=g)
    logits = model(x)
    feat = kept.pop("feat")
    loss = F.cross_entropy(logits, y)
    with hold([feat, logits]):
        losses.append(feat[3, 5, 7, 11].item())
        losses.append(torch.tensor(feat[0, 0, 0, :4].tolist()).sum())
        losses.append(torch.linalg.vector_norm(feat, dim=(1, 2, 3)).sum().detach())
        f = feat.flatten(1)
        losses.append((f @ f.T).trace().detach())
        losses.append(torch.tensor(logits.argmax(1).tolist()).float().sum())
        if step % 2: loss.backward()
    if step % 2 == 0: loss.backward()
    opt.step()
    opt.zero_grad()
    losses.append(loss.detach())
    if reg is not None:
        s = pyalloc.memory_stats()
        log.append((s["allocated_bytes.all.current"], s.get("remat.evictions", 0), reg.stats().get("evictions", 0)))
        reg.collect()
        if step == 3:
            reg.restore_all(); reg.check_invariants(); pyalloc.check_invariants()
            log.append(len(pyalloc.snapshot()["segments"]))
            pyalloc.empty_cache()
    elif policy != "plain":
        s = pyalloc.memory_stats(); log.append(s["allocated_bytes.all.current"])
    if step % 2 == 1:
        model.eval()
        with pause(), torch.no_grad():
            vl = F.cross_entropy(model(xv), yv)
            if feat_prev is not None:
                with hold([feat_prev]) if os.environ.get("PAUSED_FEAT") != "bare" else contextlib.nullcontext():
                    vl = vl + feat_prev.square().mean()
        model.train()
        losses.append(vl)
    feat_prev = feat
    del feat, f, logits, loss
print("log", log[-3:], file=sys.stderr)
report(policy, [model], losses)
