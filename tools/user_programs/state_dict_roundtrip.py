# Untuned: checkpointing in memory mid-training. A conv net (BatchNorm, dropout, a residual stage)
# keeping the outputs of its four stages by forward hooks, Adam(amsgrad) with a StepLR, 8 steps. On
# step 2, between forward and backward (activations possibly evicted): torch.save of the model's and
# the optimizer's state_dicts to io.BytesIO, torch.save of {the four, a view of one (its whole
# storage goes), logits} and copy.deepcopy of the detached activation; after loading them back their
# sums go into the losses; step 2's stage outputs are kept through step 3's forward and backward
# (there evicted or swapped out) and saved and deep-copied after it. On step 4 after opt.step(): the
# state_dicts saved again, the model deep-copied, the copy loaded from the buffer (strict), a new
# Adam loaded from the optimizer's buffer and the scheduler's state moved over; training goes on
# with the copies (the originals deleted). On step 6 the whole module is pickled by torch.save and
# loaded (weights_only=False) and compared with the live one. The step-2 state_dict is loaded into a
# spare model at the end and reported too.
import copy, io, sys, torch, torch.nn as nn, torch.nn.functional as F
from common import setup, report
policy = setup()
torch.use_deterministic_algorithms(True)
def cbr(i, o, s=1): return nn.Sequential(nn.Conv2d(i, o, 3, s, 1, bias=False), nn.BatchNorm2d(o), nn.ReLU())
class Res(nn.Module):
    def __init__(s, c): super().__init__(); s.a = cbr(c, c); s.b = cbr(c, c)
    def forward(s, x): return F.relu(x + s.b(s.a(x)))
class Net(nn.Module):
    def __init__(s):
        super().__init__()
        s.stem = cbr(3, 32); s.res1 = Res(32); s.down = cbr(32, 64, 2); s.res2 = Res(64)
        s.drop = nn.Dropout(0.2); s.fc = nn.Linear(64, 10)
    def forward(s, x):
        x = s.res2(s.down(s.res1(s.stem(x))))
        return s.fc(s.drop(x.mean((2, 3))))
model = Net()
kept = {}
class Keep:  # a class, not a lambda: torch.save(model) pickles the hooks too
    def __init__(s, name): s.name = name
    def __call__(s, m, i, o): kept[s.name] = o
for name in ("stem", "res1", "down", "res2"): getattr(model, name).register_forward_hook(Keep(name))
opt = torch.optim.Adam(model.parameters(), lr=1e-3, amsgrad=True)
sched = torch.optim.lr_scheduler.StepLR(opt, 2, 0.5)
g = torch.Generator().manual_seed(1)
losses = []
snap2 = None
for step in range(8):
    x = torch.randn(32, 3, 32, 32, generator=g); y = torch.randint(0, 10, (32,), generator=g)
    logits = model(x)
    loss = F.cross_entropy(logits, y)
    if step == 2:
        feat = kept["res1"]
        if policy not in ("plain", "none"):
            from pyalloc import registry
            ns = [registry.active().node_of(t) for t in kept.values()]
            print("step 2: evicted at save", [n is not None and n.evicted for n in ns], file=sys.stderr)
        snap2 = io.BytesIO(); torch.save(model.state_dict(), snap2)
        obuf = io.BytesIO(); torch.save(opt.state_dict(), obuf)
        abuf = io.BytesIO(); torch.save({**kept, "feat": feat, "view": feat[1:3, :8], "logits": logits}, abuf)
        dc = copy.deepcopy(feat.detach())
        abuf.seek(0); acts = torch.load(abuf)
        losses += [acts["feat"].detach().sum(), acts["view"].detach().sum(), acts["logits"].detach().sum(), dc.sum(),
                   feat.detach().sum(), torch.tensor(float(acts["feat"].equal(feat.detach())))]
        losses.append(torch.tensor(float(acts["view"].untyped_storage().nbytes())))
        losses += [acts[k].detach().double().sum() for k in kept]
        del acts, dc, feat
        old = dict(kept)
    kept.clear()
    loss.backward()
    if step == 3:
        # Step 2's stage outputs, held through step 3's forward and backward, saved now.
        if policy not in ("plain", "none"):
            print("step 3: evicted at save", [registry.active().node_of(t).evicted for t in old.values()], file=sys.stderr)
        buf = io.BytesIO(); torch.save(old, buf); buf.seek(0)
        back = torch.load(buf)
        dcs = copy.deepcopy({k: v.detach() for k, v in old.items()})
        losses += [back[k].detach().double().sum() for k in old] + [dcs[k].double().sum() for k in old]
        del old, back, dcs, buf
    opt.step(); opt.zero_grad(); sched.step()
    losses.append(loss.detach())
    if step == 4:
        mbuf = io.BytesIO(); torch.save(model.state_dict(), mbuf)
        obuf = io.BytesIO(); torch.save(opt.state_dict(), obuf)
        model2 = copy.deepcopy(model)
        mbuf.seek(0); print(model2.load_state_dict(torch.load(mbuf), strict=True), file=sys.stderr)
        opt2 = torch.optim.Adam(model2.parameters(), lr=1e-3, amsgrad=True)
        obuf.seek(0); opt2.load_state_dict(torch.load(obuf))
        sched2 = torch.optim.lr_scheduler.StepLR(opt2, 2, 0.5); sched2.load_state_dict(sched.state_dict())
        del model, opt, sched
        model, opt, sched = model2, opt2, sched2
        del model2, opt2, sched2
    if step == 6:
        whole = io.BytesIO(); torch.save(model, whole); whole.seek(0)
        back = torch.load(whole, weights_only=False)
        same = all(a.equal(b) for a, b in zip(model.state_dict().values(), back.state_dict().values()))
        losses.append(torch.tensor(float(same)))
        del back
    del logits, loss
spare = Net()
snap2.seek(0); spare.load_state_dict(torch.load(snap2))
report(policy, [model, spare], losses)
