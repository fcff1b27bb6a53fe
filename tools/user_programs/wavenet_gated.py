# Untuned: a WaveNet on random mu-law "audio". One-hot input (F.one_hot over 256 classes, permute
# to (B, C, T)), a causal conv, then stacks of residual layers as the paper writes them: the input
# left-padded by F.pad((dilation * (k - 1), 0)) for a dilated causal nn.Conv1d to 2C channels, split
# by chunk into a gated tanh(a) * sigmoid(b) activation, a global conditioning embedding added
# before the gate, 1x1 convs to a residual and a skip output; the residual added in place
# (x += res), the skips summed into an accumulator (skip = skip + s, the first one a zeros_like).
# Head: ReLU(inplace=True), 1x1 conv, ReLU, 1x1 conv to 256 logits, cross entropy on the next
# sample (shifted by one). Gradients clipped by clip_grad_norm_, Adam, 3 steps; then a few samples
# generated autoregressively under no_grad on a short receptive-field window (multinomial).
import torch, torch.nn as nn, torch.nn.functional as F
from common import setup, report
policy = setup()
torch.use_deterministic_algorithms(True)
B, T, Q, C, SKIP, NSPK = 8, 1024, 256, 32, 64, 4
DILATIONS = [1, 2, 4, 8, 16, 32, 64, 128] * 2
class ResLayer(nn.Module):
    def __init__(s, d):
        super().__init__(); s.d = d
        s.conv = nn.Conv1d(C, 2 * C, 2, dilation=d)
        s.cond = nn.Linear(16, 2 * C)
        s.res = nn.Conv1d(C, C, 1); s.skip = nn.Conv1d(C, SKIP, 1)
    def forward(s, x, g):
        h = s.conv(F.pad(x, (s.d, 0)))
        h = h + s.cond(g).unsqueeze(-1)
        a, b = h.chunk(2, dim=1)
        z = torch.tanh(a) * torch.sigmoid(b)
        return s.res(z), s.skip(z)
class WaveNet(nn.Module):
    def __init__(s):
        super().__init__()
        s.spk = nn.Embedding(NSPK, 16)
        s.causal = nn.Conv1d(Q, C, 2)
        s.layers = nn.ModuleList(ResLayer(d) for d in DILATIONS)
        s.head = nn.Sequential(nn.ReLU(inplace=True), nn.Conv1d(SKIP, SKIP, 1), nn.ReLU(), nn.Conv1d(SKIP, Q, 1))
    def forward(s, codes, spk):
        x = F.one_hot(codes, Q).float().permute(0, 2, 1)
        x = s.causal(F.pad(x, (1, 0)))
        g = s.spk(spk)
        skip = None
        for l in s.layers:
            r, sk = l(x, g)
            x += r
            skip = torch.zeros_like(sk) + sk if skip is None else skip + sk
        return s.head(skip)
model = WaveNet()
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
gen = torch.Generator().manual_seed(1)
losses = []
for step in range(3):
    t = torch.linspace(0, 60, T + 1)
    wave = torch.sin(t[None] * torch.rand(B, 1, generator=gen) * 3) * 0.8 + 0.1 * torch.randn(B, T + 1, generator=gen)
    mu = torch.sign(wave) * torch.log1p(255 * wave.abs().clamp(max=1)) / torch.log1p(torch.tensor(255.0))
    codes = ((mu + 1) / 2 * 255 + 0.5).long().clamp(0, Q - 1)
    spk = torch.randint(0, NSPK, (B,), generator=gen)
    logits = model(codes[:, :-1], spk)
    loss = F.cross_entropy(logits, codes[:, 1:])
    opt.zero_grad()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    losses.append(loss.detach())
model.eval()
with torch.no_grad():
    seq = codes[:2, :64].clone()
    for i in range(16):
        lg = model(seq[:, -64:], spk[:2])[:, :, -1]
        nxt = torch.multinomial(F.softmax(lg, -1), 1, generator=gen)
        seq = torch.cat([seq, nxt], 1)
    losses.append(seq.float().sum())
report(policy, [model], losses)
