# Untuned: a training loop that survives exceptions. A token MLP-mixer-style net; on step 1 a
# register_forward_hook on a middle block raises ValueError midway through forward (caught, batch
# skipped, opt.zero_grad(); the exception object - whose traceback holds the forward's frames and
# activations - is kept in a list), on step 2 a tensor register_hook on an activation raises during
# backward (caught after part of the gradients were accumulated, opt.zero_grad(), skipped), on step 3
# the input carries a NaN and the loss is skipped by torch.isfinite(loss), step 4 runs under
# torch.autograd.set_detect_anomaly(True), steps 0 and 5 are normal. AdamW, 6 steps.
import torch, torch.nn as nn, torch.nn.functional as F
from common import setup, report
policy = setup()
B, T, D, C = 32, 64, 256, 10
class Block(nn.Module):
    def __init__(s):
        super().__init__()
        s.n1 = nn.LayerNorm(D); s.tok = nn.Linear(T, T)
        s.n2 = nn.LayerNorm(D); s.ff1 = nn.Linear(D, 2 * D); s.ff2 = nn.Linear(2 * D, D)
    def forward(s, x):
        x = x + s.tok(s.n1(x).transpose(1, 2)).transpose(1, 2)
        return x + s.ff2(F.gelu(s.ff1(s.n2(x))))
class Net(nn.Module):
    def __init__(s):
        super().__init__()
        s.inp = nn.Linear(32, D)
        s.blocks = nn.ModuleList([Block() for _ in range(4)])
        s.head = nn.Linear(D, C)
        s.mid = None
    def forward(s, x):
        h = s.inp(x)
        for i, b in enumerate(s.blocks):
            h = b(h)
            if i == 1: s.mid = h
        return s.head(h.mean(1))
model = Net()
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
fail = {"fwd": False, "bwd": False}
def fwd_hook(mod, inp, out):
    if fail["fwd"]: raise ValueError("bad batch in forward")
model.blocks[2].register_forward_hook(fwd_hook)
def bwd_hook(grad):
    if fail["bwd"]: raise ValueError("bad gradient in backward")
    return grad
g = torch.Generator().manual_seed(1)
losses, errors = [], []
for step in range(6):
    x = torch.randn(B, T, 32, generator=g)
    y = torch.randint(0, C, (B,), generator=g)
    if step == 3: x[5, 7, 3] = float("nan")
    fail["fwd"] = step == 1
    fail["bwd"] = step == 2
    try:
        with torch.autograd.set_detect_anomaly(step == 4):
            logits = model(x)
            model.mid.register_hook(bwd_hook)
            loss = F.cross_entropy(logits, y)
            if not torch.isfinite(loss):
                losses.append(torch.tensor(-2.0)); opt.zero_grad(); continue
            loss.backward()
    except ValueError as e:
        errors.append(e)
        losses.append(torch.tensor(-1.0 - step))
        if step == 2: losses.append(sum(p.grad.double().sum() for p in model.parameters() if p.grad is not None))
        opt.zero_grad()
        continue
    opt.step()
    opt.zero_grad()
    losses.append(loss.detach())
    losses.append(logits.detach().sum())
losses.append(torch.tensor(float(len(errors))))
report(policy, [model], losses)
