# Untuned: parameters rewritten outside the optimizer while activations computed from their old
# values are still held by the program. A residual token MLP keeps the previous step's logits and features (prev = logits,
# graph and all) for a consistency loss against prev.detach() on the next step and logs prev.sum().item()
# after each optimizer step; a state dict saved with copy.deepcopy(model.state_dict()) at step 0;
# after step 1 an EMA copy (copy.deepcopy(model)) updated with torch._foreach_lerp_ (and a loop of
# lerp_ on its buffers); after step 2 `with torch.no_grad(): model.fc.weight.mul_(0.5)`; after step 3
# model.load_state_dict(saved_state); after step 4 p.data.normal_() re-initialises one layer; on
# step 5 p.data.normal_() re-initialises another layer between forward and backward (plain PyTorch
# then backpropagates through the new weights with the old activations); after step 5 .data rebound
# (p.data = p.data * 0.9, p.data = p.data.clone()); on step 6, between forward and backward, a
# weight's .data rebound to a fresh tensor and the input batch's too (x.data = x.data * 0.5; plain
# PyTorch's backward then reads the new values). SGD+momentum, 7 steps.
import copy, torch, torch.nn as nn, torch.nn.functional as F
from common import setup, report
policy = setup()
B, T, D, C = 64, 64, 256, 16
class Net(nn.Module):
    def __init__(s):
        super().__init__()
        s.inp = nn.Linear(32, D)
        s.l1 = nn.Linear(D, 2 * D); s.l2 = nn.Linear(2 * D, D)
        s.norm = nn.LayerNorm(D)
        s.l3 = nn.Linear(D, 2 * D); s.l4 = nn.Linear(2 * D, D)
        s.extra = nn.ModuleList([nn.Sequential(nn.LayerNorm(D), nn.Linear(D, D), nn.GELU(), nn.Linear(D, D)) for _ in range(4)])
        s.bn = nn.BatchNorm1d(D)
        s.fc = nn.Linear(D, C)
    def forward(s, x):
        h = F.gelu(s.inp(x))
        h = h + s.l2(torch.tanh(s.l1(h)))
        h = s.norm(h)
        h = h + s.l4(F.silu(s.l3(h)))
        for blk in s.extra: h = h + blk(h)
        h = s.bn(h.transpose(1, 2)).transpose(1, 2)
        return s.fc(h).mean(1), h
model = Net()
saved_state = copy.deepcopy(model.state_dict())
opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
g = torch.Generator().manual_seed(1)
x_fixed = torch.randn(B, T, 32, generator=g)
losses = []
prev, ema = None, None
for step in range(7):
    x = x_fixed + 0.1 * torch.randn(B, T, 32, generator=g)
    y = torch.randint(0, C, (B,), generator=g)
    logits, feat = model(x)
    loss = F.cross_entropy(logits, y)
    if prev is not None:
        loss = loss + 0.1 * F.mse_loss(logits, prev.detach()) + 0.1 * F.mse_loss(feat, prev_feat.detach())
    if step == 5:
        with torch.no_grad():
            model.l3.weight.data.normal_(0, 0.02, generator=g)
    if step == 6:  # rebinding .data between forward and backward: a weight and the input batch
        model.l2.weight.data = torch.randn(D, 2 * D, generator=g) * 0.02
        x.data = x.data * 0.5
    opt.zero_grad()
    loss.backward()
    opt.step()
    losses += [loss.detach()]
    if prev is not None:  # old logits and features, read after the parameters moved
        losses += [torch.tensor(prev.sum().item()), torch.tensor(prev_feat.sum().item())]
    prev, prev_feat = logits, feat
    losses.append(prev.detach().square().sum())
    if step == 1:
        ema = copy.deepcopy(model)
        ema.requires_grad_(False)
    elif ema is not None:
        with torch.no_grad():
            torch._foreach_lerp_(list(ema.parameters()), list(model.parameters()), 0.1)
            for be, bm in zip(ema.buffers(), model.buffers()):
                if be.is_floating_point(): be.lerp_(bm, 0.1)
    if step == 2:
        with torch.no_grad():
            model.fc.weight.mul_(0.5)
    if step == 3:
        model.load_state_dict(saved_state)
    if step == 4:
        for p in model.l1.parameters(): p.data.normal_(0, 0.02, generator=g)
    if step == 5:
        model.l4.weight.data = model.l4.weight.data * 0.9
        model.inp.weight.data = model.inp.weight.data.clone()
    losses += [torch.tensor(prev.sum().item()), torch.tensor(prev_feat[:, 0].sum().item())]
ema.eval()
with torch.no_grad():
    losses.append(ema(x_fixed)[0].sum())
losses += [prev.detach().sum(), prev_feat.detach().double().sum()]
report(policy, [model, ema], losses)
