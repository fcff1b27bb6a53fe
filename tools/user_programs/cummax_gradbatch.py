# Untuned: a forecaster on gappy multivariate series. Missing readings are NaN: masked by isnan and
# zeroed by nan_to_num (posinf=/neginf= on the gradient penalty too); each block convolves over time by Tensor.unfold windows and an einsum, keeps a running maximum
# by torch.cummax (values gated into the stream, indices turned into a "steps since the peak"
# feature) and a running minimum by torch.cummin, a log feature, first differences by torch.diff; the targets
# are NaN-padded too (a masked MSE). The loss adds an input-gradient penalty: the four pooled
# outputs' gradients with respect to the input all at once by
# torch.autograd.grad(is_grads_batched=True, create_graph=True) over an identity of
# grad_outputs (BATCHED=0: a Python loop of autograd.grad instead). Adam, 4 steps.
import os, torch, torch.nn as nn, torch.nn.functional as F
from common import setup, report
policy = setup()
torch.use_deterministic_algorithms(True)
B, T, CIN, C, K, NOUT = 24, 192, 8, 48, 5, 4

class Block(nn.Module):
    def __init__(s, c, k):
        super().__init__()
        s.k = k; s.win = nn.Parameter(torch.randn(c, k) / k); s.gate = nn.Linear(c, c); s.mix = nn.Linear(3 * c, c)
        s.norm = nn.LayerNorm(c)
    def forward(s, h):
        B, T, C = h.shape
        hp = F.pad(h, (0, 0, s.k - 1, 0))                       # causal padding over time
        win = hp.unfold(1, s.k, 1)                               # (B, T, C, k)
        conv = torch.einsum("btck,ck->btc", win, s.win)
        peak, idx = torch.cummax(conv, dim=1)
        since = (torch.arange(T).view(1, T, 1) - idx).float() / T
        low = torch.cummin(conv, dim=1).values
        logf = torch.log(F.relu(conv) + 1e-4)
        d = torch.diff(conv, dim=1, prepend=conv[:, :1])
        g = torch.sigmoid(s.gate(h))
        z = torch.cat([g * peak + (1 - g) * low, logf * since, d], -1)
        return s.norm(h + F.silu(s.mix(z)))

class Net(nn.Module):
    def __init__(s):
        super().__init__()
        s.inp = nn.Linear(2 * CIN, C); s.blocks = nn.Sequential(*[Block(C, K) for _ in range(3)])
        s.out = nn.Linear(C, NOUT)
    def forward(s, x):
        miss = torch.isnan(x)
        xin = torch.cat([torch.nan_to_num(x, nan=0.0), miss.float()], -1)
        return s.out(s.blocks(s.inp(xin)))

model = Net()
opt = torch.optim.Adam(model.parameters(), lr=2e-3)
g = torch.Generator().manual_seed(1)
eye = torch.eye(NOUT)
losses = []
for step in range(4):
    x = torch.randn(B, T, CIN, generator=g).cumsum(1) / 8
    x[torch.rand(B, T, CIN, generator=g) < 0.15] = float("nan")
    y = torch.randn(B, T, NOUT, generator=g)
    y[torch.rand(B, T, NOUT, generator=g) < 0.1] = float("nan")
    x.requires_grad_(True)
    pred = model(x)
    ok = ~torch.isnan(y)
    mse = ((pred - torch.nan_to_num(y)) ** 2 * ok).sum() / ok.sum()
    pooled = pred.mean(1)                                       # (B, NOUT)
    if os.environ.get("BATCHED", "1") == "1":
        go = eye[:, None, :].expand(NOUT, B, NOUT)
        (gx,) = torch.autograd.grad(pooled, x, grad_outputs=go, is_grads_batched=True, create_graph=True)
    else:
        gx = torch.stack([torch.autograd.grad(pooled, x, grad_outputs=eye[i].expand(B, NOUT), create_graph=True, retain_graph=True)[0] for i in range(NOUT)])
    penalty = torch.nan_to_num(gx, posinf=0.0, neginf=0.0).pow(2).sum((0, 2, 3)).mean()
    loss = mse + 0.01 * penalty
    opt.zero_grad()
    loss.backward()
    opt.step()
    losses.append(loss.detach())
report(policy, [model], losses)
