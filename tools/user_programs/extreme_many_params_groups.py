# Untuned: a "learned per-step modulation" network with thousands of tiny parameters, written the
# way someone who wants one knob per step writes it: 5,000 separate nn.Parameters in one
# nn.ParameterList (scalars, 128-wide gain vectors and 128-wide bias vectors in turn), walked by a
# Python loop that modulates a 32 x 128 state (16 KiB) one parameter at a time, with a shared
# Linear(128, 128) every 250 parameters. Every tenth scalar is used twice, and every 97th vector
# only on the first micro-batch (so it has no gradient from the second). Five optimizer param
# groups (AdamW): scalars, gains, biases, the Linears' weights and their biases, each with its own
# lr and weight decay (one group amsgrad). Gradient accumulation over 2 micro-batches (loss / 2),
# clip_grad_norm_ over all 5,000+ tensors (its total norm logged), zero_grad(set_to_none=False) on
# even steps and set_to_none=True on odd ones, and between steps in-place edits under
# torch.no_grad(): scalars clamped, gain vectors renormalised, one bias zeroed and a
# torch._foreach_mul_ shrink of the biases. Three steps. (NP=N: N tiny parameters instead of 5,000.)
import os, torch, torch.nn as nn, torch.nn.functional as F
from common import setup, report
policy = setup()
torch.use_deterministic_algorithms(True)
NP, B, W, EVERY = int(os.environ.get("NP", "5000")), 32, 128, 250
class Model(nn.Module):
    def __init__(s):
        super().__init__()
        ps = []
        for i in range(NP):
            if i % 3 == 0: ps.append(nn.Parameter(torch.tensor(0.1 + 0.001 * (i % 7))))
            elif i % 3 == 1: ps.append(nn.Parameter(1 + 0.01 * torch.randn(W)))
            else: ps.append(nn.Parameter(0.01 * torch.randn(W)))
        s.ps = nn.ParameterList(ps)
        s.mix = nn.ModuleList(nn.Linear(W, W) for _ in range(NP // EVERY + 1))
        s.inp = nn.Linear(16, W)
        s.out = nn.Linear(W, 1)
    def forward(s, x, micro):
        h = torch.tanh(s.inp(x))
        for i, p in enumerate(s.ps):
            if i % EVERY == 0:
                h = h + 0.5 * torch.tanh(s.mix[i // EVERY](h))
            if i % 97 == 0 and i % 3 and micro == 1:
                continue                                             # unused on this micro-batch
            if i % 3 == 0:
                h = h + p * torch.tanh(h) * 0.1
                if i % 10 == 0:
                    h = h - 0.01 * p * h                              # the scalar used twice
            elif i % 3 == 1:
                h = h * p
            else:
                h = h + p
            if i % 50 == 49:
                h = F.layer_norm(h, (W,))
        return s.out(h).squeeze(1)
model = Model()
scal = [p for i, p in enumerate(model.ps) if i % 3 == 0]
gain = [p for i, p in enumerate(model.ps) if i % 3 == 1]
bias = [p for i, p in enumerate(model.ps) if i % 3 == 2]
lw = [m.weight for m in model.mix] + [model.inp.weight, model.out.weight]
lb = [m.bias for m in model.mix] + [model.inp.bias, model.out.bias]
opt = torch.optim.AdamW([
    {"params": scal, "lr": 3e-3, "weight_decay": 0.0},
    {"params": gain, "lr": 1e-3, "weight_decay": 0.1},
    {"params": bias, "lr": 2e-3, "weight_decay": 0.0, "amsgrad": True},
    {"params": lw, "lr": 5e-4, "weight_decay": 0.05},
    {"params": lb, "weight_decay": 0.0},
], lr=1e-3)
g = torch.Generator().manual_seed(1)
losses = []
for step in range(3):
    opt.zero_grad(set_to_none=(step % 2 == 1))
    for micro in range(2):
        x = torch.randn(B, 16, generator=g)
        y = torch.randn(B, generator=g)
        pred = model(x, micro)
        loss = F.mse_loss(pred, y) / 2
        loss.backward()
        losses.append(loss.detach())
    total = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)
    opt.step()
    losses.append(total)
    with torch.no_grad():
        for p in scal: p.clamp_(-0.5, 0.5)
        for p in gain[::5]: p.div_(p.norm() / W ** 0.5)
        bias[step].zero_()
        torch._foreach_mul_(bias[::3], 0.999)
report(policy, [model], losses)
