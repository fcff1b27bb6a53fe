# Untuned: odd shapes, strides and dtypes of activations. A token model where: argmax indices
# (int64) feed an nn.Embedding (saved for its backward) and a bool mask feeds masked_fill, both kept
# and read after backward (accuracy, mask counts); a per-sample mean expand()ed back over time (zero
# stride) multiplies the activation (read in backward); narrow, unfold and as_strided views of
# activations are saved for backward; a 0-dim scalar activation (the batch mean) gates the output;
# torch.fft.rfft over time gives a complex64 activation whose view_as_real feeds a loss, and .abs()
# of it another; one submodule runs in float64 (.double()); the default dtype is left alone. Step 2
# has an empty batch (batch size 0): forward and backward on it (the rfft, which MKL refuses on an
# empty batch, replaced by a cast to complex64 there), losses as sums / max(B, 1). Adam, 5 steps.
import torch, torch.nn as nn, torch.nn.functional as F
from common import setup, report
policy = setup()
T, D, V, C = 64, 192, 50, 10
class Net(nn.Module):
    def __init__(s):
        super().__init__()
        s.inp = nn.Linear(24, D)
        s.n1 = nn.LayerNorm(D)
        s.l1 = nn.Linear(D, D)
        s.emb = nn.Embedding(V, D)
        s.dbl = nn.Sequential(nn.Linear(D, D), nn.Tanh(), nn.Linear(D, D)).double()
        s.l2 = nn.Linear(D, D)
        s.l3 = nn.Linear(D, D)
        s.spec = nn.Linear(D, D)
        s.head = nn.Linear(D, C)
    def forward(s, x):
        B = x.shape[0]
        h = F.gelu(s.inp(x))
        h = s.n1(h + s.l1(h))
        idx = h.argmax(-1) % V                         # int64 activation
        h = h + s.emb(idx)
        mask = h.mean(-1, keepdim=True) > 0            # bool activation
        h = h.masked_fill(mask, 0.0) + 0.5 * h
        m = h.mean(1, keepdim=True).expand(-1, T, -1)  # zero-strided view of an activation
        h = h * torch.sigmoid(m)
        h = h + s.dbl(h.double()).float()              # a float64 submodule
        a = h.narrow(1, 2, T - 4)                      # narrow view saved by mul
        a = a * torch.tanh(a)
        w = s.l2(a).unfold(1, 4, 2)                    # (B, nwin, D, 4) view saved by mul
        u = (w * w.flip(-1)).sum(-1)
        c = s.l3(u).contiguous()
        st = c.as_strided((B, c.shape[1] // 2, D), (c.shape[1] * D, 2 * D, 1))  # every other window
        v = st * torch.sigmoid(st)
        gate = v.mean()                                # 0-dim scalar activation
        z = torch.fft.rfft(s.spec(v), dim=1) if B else s.spec(v).to(torch.complex64)  # complex64; MKL's rfft rejects B=0
        out = s.head(v.mean(1)) * torch.sigmoid(gate)
        return out, z, idx, mask
model = Net()
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
g = torch.Generator().manual_seed(1)
losses = []
for step, B in enumerate([32, 32, 0, 32, 32]):
    x = torch.randn(B, T, 24, generator=g)
    y = torch.randint(0, C, (B,), generator=g)
    out, z, idx, mask = model(x)
    n = max(B, 1)
    l_cls = F.cross_entropy(out, y, reduction="sum") / n
    l_spec = torch.view_as_real(z).square().sum() / (n * 1e4)
    l_mag = z.abs().sum() / (n * 1e4)
    loss = l_cls + l_spec + 0.1 * l_mag
    opt.zero_grad()
    loss.backward()
    opt.step()
    losses += [loss.detach(), l_spec.detach(), l_mag.detach()]
    # the int64 and bool activations, read after backward and the step
    losses += [idx.sum(), mask.sum(), (idx == y[:, None] % V).sum(), idx.flatten().bincount(minlength=V).max() if B else torch.tensor(-1)]
    losses += [torch.view_as_real(z.detach()).sum(), z.detach().real.abs().max() if B else torch.tensor(-1.0)]
report(policy, [model], losses)
