# Untuned: an RWKV-4-style recurrent language model trained in parallel over the sequence. Token
# shift by F.pad and slicing, time-mixing with learned mix coefficients and a learned decay
# w = -exp(time_decay), the WKV recurrence computed by a Python loop over time with a numerically
# stable running max (torch.maximum, exp of differences), receptance gating, channel-mixing with a
# squared ReLU, LayerNorms, and AdamW with weight decay only on the 2-D weight matrices (STATE=1: the
# WKV state (aa, bb, pp) carried detached from batch to batch, the stream read as consecutive chunks).
import os, torch, torch.nn as nn, torch.nn.functional as F
from common import setup, report
policy = setup()
torch.use_deterministic_algorithms(True)
STATE = os.environ.get("STATE") == "1"
V, C, L, B, T = 300, 64, 3, 32, 40
def wkv(w, u, k, v, state=None):
    # w, u: (C,), k, v: (B, T, C); returns (B, T, C)
    Bk, Tk, Ck = k.shape
    aa = torch.zeros(Bk, Ck); bb = torch.zeros(Bk, Ck); pp = torch.full((Bk, Ck), -1e38)
    if state is not None: aa, bb, pp = state
    outs = []
    for t in range(Tk):
        kk, vv = k[:, t], v[:, t]
        ww = u + kk
        p = torch.maximum(pp, ww)
        e1, e2 = torch.exp(pp - p), torch.exp(ww - p)
        outs.append((e1 * aa + e2 * vv) / (e1 * bb + e2))
        ww = w + pp
        p = torch.maximum(ww, kk)
        e1, e2 = torch.exp(ww - p), torch.exp(kk - p)
        aa = e1 * aa + e2 * vv
        bb = e1 * bb + e2
        pp = p
    return torch.stack(outs, 1), (aa, bb, pp)
class TimeMix(nn.Module):
    def __init__(self, i):
        super().__init__()
        r = torch.arange(C) / C
        self.time_decay = nn.Parameter(-5 + 8 * (r ** (0.7 + 1.3 * i / L)))
        self.time_first = nn.Parameter(torch.full((C,), 0.5) + 0.1 * (torch.arange(C) % 3 - 1))
        self.mix_k = nn.Parameter(r.clone()); self.mix_v = nn.Parameter(r + 0.3 * i / L); self.mix_r = nn.Parameter(0.5 * r)
        self.key, self.value, self.receptance = (nn.Linear(C, C, bias=False) for _ in range(3))
        self.output = nn.Linear(C, C, bias=False)
        self.state = None
    def forward(self, x):
        xx = F.pad(x, (0, 0, 1, -1))  # shift one step along time
        k = self.key(x * self.mix_k + xx * (1 - self.mix_k))
        v = self.value(x * self.mix_v + xx * (1 - self.mix_v))
        r = torch.sigmoid(self.receptance(x * self.mix_r + xx * (1 - self.mix_r)))
        w = -torch.exp(self.time_decay)
        y, st = wkv(w, self.time_first, k, v, self.state)
        if STATE: self.state = tuple(s.detach() for s in st)
        return self.output(r * y)
class ChannelMix(nn.Module):
    def __init__(self):
        super().__init__()
        self.mix_k = nn.Parameter(torch.linspace(0, 1, C)); self.mix_r = nn.Parameter(torch.linspace(0, 1, C))
        self.key, self.value = nn.Linear(C, 4 * C, bias=False), nn.Linear(4 * C, C, bias=False)
        self.receptance = nn.Linear(C, C, bias=False)
    def forward(self, x):
        xx = torch.cat([torch.zeros_like(x[:, :1]), x[:, :-1]], 1)
        k = torch.square(torch.relu(self.key(x * self.mix_k + xx * (1 - self.mix_k))))
        return torch.sigmoid(self.receptance(x * self.mix_r + xx * (1 - self.mix_r))) * self.value(k)
class Block(nn.Module):
    def __init__(self, i):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(C), nn.LayerNorm(C)
        self.att, self.ffn = TimeMix(i), ChannelMix()
    def forward(self, x):
        x = x + self.att(self.ln1(x))
        return x + self.ffn(self.ln2(x))
class RWKV(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(V, C)
        self.ln0 = nn.LayerNorm(C)
        self.blocks = nn.ModuleList(Block(i) for i in range(L))
        self.ln_out = nn.LayerNorm(C)
        self.head = nn.Linear(C, V, bias=False)
    def forward(self, idx):
        x = self.ln0(self.emb(idx))
        for b in self.blocks: x = b(x)
        return self.head(self.ln_out(x))
g = torch.Generator().manual_seed(1)
model = RWKV()
stream = torch.randint(0, V, (B, 3 * T + 1), generator=g)
decay, no_decay = [], []
for n, p in model.named_parameters():
    (decay if p.dim() == 2 and "emb" not in n else no_decay).append(p)
opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                        lr=1e-3, betas=(0.9, 0.99), eps=1e-8)
losses = []
for step in range(3):
    data = stream[:, step * T:(step + 1) * T + 1] if STATE else torch.randint(0, V, (B, T + 1), generator=g)
    logits = model(data[:, :-1])
    loss = F.cross_entropy(logits.reshape(-1, V), data[:, 1:].reshape(-1))
    opt.zero_grad()
    loss.backward()
    opt.step()
    losses.append(loss.detach())
if STATE: losses += [s.sum() for b in model.blocks for s in b.att.state]
report(policy, [model], losses)
