"""Variable-length sequences as a jagged nested tensor (torch.nested.nested_tensor(list,
layout=torch.jagged)) through a small transformer encoder with no padding: an Embedding on the NJT of ids, Linear layers
(separate q/k/v projections), LayerNorm, GELU and residual adds on the NJT, multi-head attention by
F.scaled_dot_product_attention on jagged q/k/v (transpose(1, 2) of the (B, j, H, Dh) NJT), a
per-sequence mean pool by unbind, and a token-level loss over to_padded_tensor() output masked
by the lengths; AdamW, 4 steps with new lengths each step. NJT=unbind: the token loss over
torch.cat of the unbound components instead of the padded tensor."""
from common import setup, report
import os, math, torch, torch.nn as nn, torch.nn.functional as F
policy = setup()
V, D, H, L, B, C = 300, 96, 4, 3, 24, 10

class Block(nn.Module):
    def __init__(s):
        super().__init__()
        s.n1 = nn.LayerNorm(D); s.q, s.k, s.v = nn.Linear(D, D), nn.Linear(D, D), nn.Linear(D, D); s.o = nn.Linear(D, D)
        s.n2 = nn.LayerNorm(D); s.fc1 = nn.Linear(D, 4 * D); s.fc2 = nn.Linear(4 * D, D)
    def forward(s, x):                                    # x: NJT (B, j, D)
        b = x.size(0)
        h = s.n1(x)    # (a packed qkv Linear + chunk is refused: SDPA wants contiguous NJT q/k/v)
        q, k, v = (lin(h).unflatten(-1, (H, D // H)).transpose(1, 2) for lin in (s.q, s.k, s.v))   # (B, H, j, Dh)
        a = F.scaled_dot_product_attention(q, k, v)
        x = x + s.o(a.transpose(1, 2).flatten(-2))
        return x + s.fc2(F.gelu(s.fc1(s.n2(x))))

class Enc(nn.Module):
    def __init__(s):
        super().__init__()
        s.emb = nn.Embedding(V, D); s.blocks = nn.ModuleList(Block() for _ in range(L))
        s.norm = nn.LayerNorm(D); s.tok = nn.Linear(D, V); s.cls = nn.Linear(D, C)
    def forward(s, ids):                                  # ids: NJT of token ids (B, j)
        x = s.emb(ids)
        for blk in s.blocks: x = blk(x)
        x = s.norm(x)
        return s.tok(x), s.cls(torch.stack([c.mean(0) for c in x.unbind()]))

model = Enc(); opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
g = torch.Generator().manual_seed(1); losses = []
for step in range(4):
    lens = torch.randint(40, 160, (B,), generator=g).tolist()
    seqs = [torch.randint(0, V, (n,), generator=g) for n in lens]
    ys = torch.randint(0, C, (B,), generator=g)
    tok, cls = model(torch.nested.nested_tensor(seqs, layout=torch.jagged))
    if os.environ.get("NJT") == "unbind":
        tl = F.cross_entropy(torch.cat(tok.unbind()), torch.cat(seqs))
    else:
        padded = tok.to_padded_tensor(0.0)                 # (B, max_len, V)
        tgt = torch.full(padded.shape[:2], -100, dtype=torch.long)
        for i, t in enumerate(seqs): tgt[i, :len(t)] = t
        tl = F.cross_entropy(padded.reshape(-1, V), tgt.reshape(-1), ignore_index=-100)
    loss = tl + F.cross_entropy(cls, ys)
    opt.zero_grad(set_to_none=True); loss.backward(); opt.step()
    losses.append(loss.detach())
report(policy, [model], losses)
