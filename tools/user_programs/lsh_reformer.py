# Untuned: Reformer-style LSH attention in an ordinary (non-reversible) residual LM. Shared-QK
# vectors are hashed into buckets by random rotations (torch.randn with a fixed generator, argmax
# over cat([xR, -xR])), tokens argsorted by bucket then position, gathered into sorted order,
# attention in chunks to themselves and to the previous chunk (reshape, cat), self-attention masked
# out unless a token is alone, the sort undone by scatter and by argsort-of-argsort, and several
# hashing rounds combined with softmax weights of their logsumexp (INPLACE=1: unsorted by scatter_ into
# fresh buffers).
import math, os, torch, torch.nn as nn, torch.nn.functional as F
from common import setup, report
policy = setup()
torch.use_deterministic_algorithms(True)
INPLACE = os.environ.get("INPLACE") == "1"
V, D, H, L, B, T, NBK, CH, NH = 256, 64, 2, 2, 12, 128, 8, 16, 2
def look_back(x):
    # x: (..., nchunks, CH, d) -> (..., nchunks, 2*CH, d), each chunk with the previous one
    prev = torch.cat([x[..., -1:, :, :], x[..., :-1, :, :]], dim=-3)
    return torch.cat([x, prev], dim=-2)
class LSHAttention(nn.Module):
    def __init__(self):
        super().__init__()
        self.qk, self.v, self.o = nn.Linear(D, D, bias=False), nn.Linear(D, D, bias=False), nn.Linear(D, D)
        self.dh = D // H
    def hash(self, qk, gen):
        # (B, H, T, dh) -> buckets (B, H, NH, T)
        rot = torch.randn(self.dh, NH, NBK // 2, generator=gen)
        xr = torch.einsum("bhtd,dnr->bhntr", F.normalize(qk, dim=-1), rot)
        return torch.cat([xr, -xr], -1).argmax(-1)
    def forward(self, x, gen):
        Bx = x.size(0)
        qk = self.qk(x).view(Bx, T, H, self.dh).transpose(1, 2)
        v = self.v(x).view(Bx, T, H, self.dh).transpose(1, 2)
        buckets = self.hash(qk, gen)                                   # (B,H,NH,T)
        pos = torch.arange(T)
        keys = buckets * T + pos                                       # bucket then position
        sidx = keys.argsort(-1)                                        # (B,H,NH,T)
        undo = sidx.argsort(-1)
        st = pos[sidx]                                                 # sorted positions
        sqk = qk.unsqueeze(2).expand(-1, -1, NH, -1, -1).gather(3, sidx[..., None].expand(-1, -1, -1, -1, self.dh))
        sv = v.unsqueeze(2).expand(-1, -1, NH, -1, -1).gather(3, sidx[..., None].expand(-1, -1, -1, -1, self.dh))
        nc = T // CH
        bq = sqk.reshape(Bx, H, NH, nc, CH, self.dh)
        bk = look_back(F.normalize(bq, dim=-1))
        bv = look_back(sv.reshape(Bx, H, NH, nc, CH, self.dh))
        qt = st.reshape(Bx, H, NH, nc, CH)
        kt = look_back(qt[..., None]).squeeze(-1)
        dots = bq @ bk.transpose(-1, -2) / math.sqrt(self.dh)         # (B,H,NH,nc,CH,2CH)
        dots = dots.masked_fill(qt[..., :, None] < kt[..., None, :], float("-inf"))  # causal
        self_mask = qt[..., :, None] == kt[..., None, :]
        dots = dots.masked_fill(self_mask, -1e5)                      # self only when alone
        lse = torch.logsumexp(dots, -1, keepdim=True)
        p = torch.exp(dots - lse)
        so = (p @ bv).reshape(Bx, H, NH, T, self.dh)
        slse = lse.reshape(Bx, H, NH, T)
        # undo the sort: outputs by scatter, logsumexp by gather with argsort-of-argsort
        if INPLACE:  # the same, written into fresh buffers in place
            out = so.new_zeros(so.shape)
            out.scatter_(3, sidx[..., None].expand(-1, -1, -1, -1, self.dh), so)
            lse_u = torch.empty_like(slse)
            lse_u.scatter_(3, sidx, slse)
        else:
            out = torch.zeros_like(so).scatter(3, sidx[..., None].expand(-1, -1, -1, -1, self.dh), so)
            lse_u = slse.gather(3, undo)
        w = torch.softmax(lse_u, dim=2).unsqueeze(-1)                 # combine hashing rounds
        o = (out * w).sum(2).transpose(1, 2).reshape(Bx, T, D)
        return self.o(o)
class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln1, self.ln2, self.att = nn.LayerNorm(D), nn.LayerNorm(D), LSHAttention()
        self.ff = nn.Sequential(nn.Linear(D, 4 * D), nn.GELU(), nn.Linear(4 * D, D))
    def forward(self, x, gen):
        x = x + self.att(self.ln1(x), gen)
        return x + self.ff(self.ln2(x))
class Reformer(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb, self.pos = nn.Embedding(V, D), nn.Parameter(torch.randn(T, D) * 0.02)
        self.blocks = nn.ModuleList(Block() for _ in range(L))
        self.ln, self.head = nn.LayerNorm(D), nn.Linear(D, V)
    def forward(self, x, gen):
        h = self.emb(x) + self.pos
        for b in self.blocks: h = b(h, gen)
        return self.head(self.ln(h))
g = torch.Generator().manual_seed(1)
hash_gen = torch.Generator().manual_seed(1234)
model = Reformer()
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
losses = []
for step in range(3):
    data = torch.randint(0, V, (B, T + 1), generator=g)
    logits = model(data[:, :-1], hash_gen)
    loss = F.cross_entropy(logits.reshape(-1, V), data[:, 1:].reshape(-1))
    opt.zero_grad()
    loss.backward()
    opt.step()
    losses.append(loss.detach())
report(policy, [model], losses)
