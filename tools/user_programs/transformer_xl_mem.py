# Untuned: a Transformer-XL-style language model trained over consecutive segments of one long
# token stream. Each layer attends over cat([mems, h]) where mems are the previous segment's hidden
# states, detached and carried across optimizer steps; a T5-style relative position bias from a
# learned table indexed by a computed log-bucket tensor (torch.log, clamp, where); causal masking
# by triu + masked_fill; tied input/output embeddings; mems updated as cat(...)[-M:].detach().
import math, torch, torch.nn as nn, torch.nn.functional as F
from common import setup, report
policy = setup()
torch.use_deterministic_algorithms(True)
V, D, H, L, B, T, M, NB = 500, 96, 4, 3, 24, 32, 32, 16
def rel_bucket(rel, num_buckets=NB, max_distance=64):
    # causal: only look back, rel = k - q <= 0
    n = (-rel).clamp(min=0)
    max_exact = num_buckets // 2
    is_small = n < max_exact
    large = max_exact + (torch.log(n.float().clamp(min=1) / max_exact) / math.log(max_distance / max_exact)
                         * (num_buckets - max_exact)).long()
    large = torch.clamp(large, max=num_buckets - 1)
    return torch.where(is_small, n, large)
class XLLayer(nn.Module):
    def __init__(self):
        super().__init__()
        self.qkv = nn.Linear(D, 3 * D)
        self.o = nn.Linear(D, D)
        self.bias = nn.Embedding(NB, H)
        self.ln1, self.ln2 = nn.LayerNorm(D), nn.LayerNorm(D)
        self.ff = nn.Sequential(nn.Linear(D, 4 * D), nn.ReLU(), nn.Dropout(0.1), nn.Linear(4 * D, D))
        self.drop = nn.Dropout(0.1)
    def forward(self, h, mem):
        cat = torch.cat([mem, h], 1) if mem is not None else h
        klen, qlen = cat.size(1), h.size(1)
        q = self.qkv(h)[..., :D]
        kv = self.qkv(cat)[..., D:]
        k, v = kv.chunk(2, -1)
        q = q.view(B, qlen, H, -1).transpose(1, 2)
        k = k.view(B, klen, H, -1).transpose(1, 2)
        v = v.view(B, klen, H, -1).transpose(1, 2)
        att = q @ k.transpose(-1, -2) / math.sqrt(D // H)
        qpos = torch.arange(klen - qlen, klen)[:, None]
        kpos = torch.arange(klen)[None, :]
        buckets = rel_bucket(kpos - qpos)
        att = att + self.bias(buckets).permute(2, 0, 1).unsqueeze(0)
        mask = torch.triu(torch.ones(qlen, klen, dtype=torch.bool), diagonal=1 + klen - qlen)
        att = att.masked_fill(mask, float("-inf"))
        p = self.drop(att.softmax(-1))
        out = (p @ v).transpose(1, 2).reshape(B, qlen, D)
        h = self.ln1(h + self.drop(self.o(out)))
        return self.ln2(h + self.ff(h))
class TransfoXL(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(V, D)
        self.layers = nn.ModuleList(XLLayer() for _ in range(L))
        self.out = nn.Linear(D, V)
        self.out.weight = self.emb.weight
    def forward(self, x, mems):
        h = self.emb(x) * math.sqrt(D)
        hids = [h]
        for i, layer in enumerate(self.layers):
            h = layer(h, mems[i] if mems is not None else None)
            hids.append(h)
        new_mems = []
        for i in range(L):
            c = torch.cat([mems[i], hids[i]], 1) if mems is not None else hids[i]
            new_mems.append(c[:, -M:].detach())
        return self.out(h), new_mems
g = torch.Generator().manual_seed(1)
stream = torch.randint(0, V, (B, T * 6 + 1), generator=g)
model = TransfoXL()
opt = torch.optim.Adam(model.parameters(), lr=2e-4)
mems, losses = None, []
for step in range(5):
    x, y = stream[:, step * T:(step + 1) * T], stream[:, step * T + 1:(step + 1) * T + 1]
    logits, mems = model(x, mems)
    loss = F.cross_entropy(logits.reshape(-1, V), y.reshape(-1))
    opt.zero_grad()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 0.25)
    opt.step()
    losses.append(loss.detach())
losses.append(torch.stack([m.sum() for m in mems]).sum())
report(policy, [model], losses)
