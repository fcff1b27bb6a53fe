# Untuned: a small Conformer-style speech encoder (feed-forward halves with SiLU, MHSA with a
# padding mask, a conv module with GLU, depthwise Conv1d, BatchNorm1d), CTC loss, AdamW,
# grad clipping, 2 accumulated micro-batches. Not in the zoo.
import torch, torch.nn as nn, torch.nn.functional as F
from common import setup, report
policy = setup()
torch.use_deterministic_algorithms(True)
D, T, B, V = 144, 160, 8, 40
class FF(nn.Module):
    def __init__(s): super().__init__(); s.n = nn.LayerNorm(D); s.a = nn.Linear(D, 4 * D); s.b = nn.Linear(4 * D, D); s.d = nn.Dropout(0.1)
    def forward(s, x): return x + 0.5 * s.d(s.b(s.d(F.silu(s.a(s.n(x))))))
class ConvMod(nn.Module):
    def __init__(s):
        super().__init__(); s.n = nn.LayerNorm(D); s.pw1 = nn.Conv1d(D, 2 * D, 1); s.dw = nn.Conv1d(D, D, 15, padding=7, groups=D)
        s.bn = nn.BatchNorm1d(D); s.pw2 = nn.Conv1d(D, D, 1); s.d = nn.Dropout(0.1)
    def forward(s, x):
        y = s.n(x).transpose(1, 2)
        y = F.glu(s.pw1(y), dim=1)
        y = F.silu(s.bn(s.dw(y)))
        return x + s.d(s.pw2(y)).transpose(1, 2)
class Block(nn.Module):
    def __init__(s):
        super().__init__(); s.ff1 = FF(); s.ff2 = FF(); s.n = nn.LayerNorm(D); s.att = nn.MultiheadAttention(D, 4, dropout=0.1, batch_first=True)
        s.conv = ConvMod(); s.out = nn.LayerNorm(D)
    def forward(s, x, pad):
        x = s.ff1(x)
        h = s.n(x); x = x + s.att(h, h, h, key_padding_mask=pad, need_weights=False)[0]
        x = s.conv(x)
        return s.out(s.ff2(x))
class Enc(nn.Module):
    def __init__(s):
        super().__init__(); s.inp = nn.Linear(80, D); s.blocks = nn.ModuleList(Block() for _ in range(3)); s.head = nn.Linear(D, V)
    def forward(s, feats, pad):
        x = s.inp(feats)
        for b in s.blocks: x = b(x, pad)
        return s.head(x).log_softmax(-1)
model = Enc()
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
g = torch.Generator().manual_seed(1)
feats = torch.randn(2, B, T, 80, generator=g)
lens = torch.randint(T // 2, T + 1, (2, B), generator=g); lens[:, 0] = T
tgt = torch.randint(1, V, (2, B, 30), generator=g); tlen = torch.randint(10, 31, (2, B), generator=g)
losses = []
for step in range(3):
    opt.zero_grad(set_to_none=True)
    for m in range(2):
        pad = torch.arange(T)[None, :] >= lens[m][:, None]
        lp = model(feats[m], pad)
        loss = F.ctc_loss(lp.transpose(0, 1), tgt[m], lens[m], tlen[m], zero_infinity=True) / 2
        loss.backward(); losses.append(loss.detach())
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
report(policy, [model], losses)
