# Untuned: a Mixture-of-Depths decoder language model (Raposo et al. 2024). Every block has a
# router (Linear D->1); per sequence the top-k tokens by router logit (topk, indices sorted back into
# causal order with sort) go through the block (causal attention among the chosen tokens, then an MLP),
# the rest skip it. Chosen rows are gathered with gather and indices expanded over the hidden size;
# the block's delta is multiplied by sigmoid of the router logit (so the router gets gradients) and
# written back three ways, by block: x.scatter(1, idx, ...) (out of place), torch.index_put on flat
# (batch, position) indices (out of place), and an in-place index_put_ into x.clone(). An auxiliary
# loss trains the router: BCE of its logits against the top-k membership mask (detached), plus a
# load-balancing term (variance over positions of the mean routing probability); a small MLP
# predictor learns the membership from a detached input for sampling-time use. Two dense blocks
# bracket four MoD blocks at capacity 25%/50%. AdamW, gradient clipping, 5 steps.
import math, torch, torch.nn as nn, torch.nn.functional as F
from common import setup, report
policy = setup()
torch.use_deterministic_algorithms(True)
V, B, T, D, H = 512, 16, 256, 192, 6
class Block(nn.Module):
    def __init__(s):
        super().__init__()
        s.ln1, s.ln2 = nn.LayerNorm(D), nn.LayerNorm(D)
        s.qkv, s.o = nn.Linear(D, 3 * D), nn.Linear(D, D)
        s.fc1, s.fc2 = nn.Linear(D, 4 * D), nn.Linear(4 * D, D)
    def delta(s, x, pos):  # x (B, k, D), pos (B, k): original positions (causal among chosen)
        Bn, k, _ = x.shape
        q, kk, v = s.qkv(s.ln1(x)).view(Bn, k, 3, H, D // H).permute(2, 0, 3, 1, 4)
        att = q @ kk.transpose(-1, -2) / math.sqrt(D // H)
        causal = pos[:, None, :, None] >= pos[:, None, None, :]
        att = att.masked_fill(~causal, float("-inf")).softmax(-1)
        a = s.o((att @ v).transpose(1, 2).reshape(Bn, k, D))
        h = x + a
        return a + s.fc2(F.gelu(s.fc1(s.ln2(h))))
class MoDBlock(nn.Module):
    def __init__(s, capacity, mode):
        super().__init__()
        s.block, s.router, s.cap, s.mode = Block(), nn.Linear(D, 1), capacity, mode
        s.predictor = nn.Sequential(nn.Linear(D, 64), nn.SiLU(), nn.Linear(64, 1))
    def forward(s, x):
        Bn, Tn, _ = x.shape
        k = int(s.cap * Tn)
        r = s.router(x).squeeze(-1)                                  # B, T
        top = torch.topk(r, k, dim=1).indices
        idx, _ = torch.sort(top, dim=1)                              # keep causal order
        ex = idx.unsqueeze(-1).expand(-1, -1, D)
        sel = torch.gather(x, 1, ex)
        w = torch.sigmoid(torch.gather(r, 1, idx)).unsqueeze(-1)
        new = sel + s.block.delta(sel, idx) * w
        if s.mode == "scatter":
            out = x.scatter(1, ex, new)
        elif s.mode == "index_put":
            bidx = torch.arange(Bn).unsqueeze(1).expand(-1, k)
            out = torch.index_put(x, (bidx.reshape(-1), idx.reshape(-1)), new.reshape(-1, D))
        else:  # in place on a clone
            out = x.clone()
            out[torch.arange(Bn).unsqueeze(1), idx] = new
        member = torch.zeros(Bn, Tn).scatter_(1, idx, 1.0)
        aux = F.binary_cross_entropy_with_logits(r, member)
        p = torch.sigmoid(r)
        aux = aux + p.mean(0).var() + (p.mean() - s.cap) ** 2
        pred = s.predictor(x.detach()).squeeze(-1)
        aux = aux + F.binary_cross_entropy_with_logits(pred, member)
        return out, aux, member.sum(0)
class DenseBlock(nn.Module):
    def __init__(s): super().__init__(); s.block = Block()
    def forward(s, x): return x + s.block.delta(x, torch.arange(x.shape[1]).expand(x.shape[0], -1))
class MoDLM(nn.Module):
    def __init__(s):
        super().__init__()
        s.emb, s.pos = nn.Embedding(V, D), nn.Parameter(torch.randn(T, D) * 0.02)
        s.first, s.last = DenseBlock(), DenseBlock()
        s.mods = nn.ModuleList([MoDBlock(0.25, "scatter"), MoDBlock(0.5, "index_put"),
                                MoDBlock(0.25, "inplace"), MoDBlock(0.5, "scatter")])
        s.lnf = nn.LayerNorm(D)
        nn.init.normal_(s.emb.weight, std=0.02)
    def forward(s, ids):
        x = s.first(s.emb(ids) + s.pos[: ids.shape[1]])
        auxes, usage = [], []
        for m in s.mods:
            x, a, u = m(x); auxes.append(a); usage.append(u)
        x = s.lnf(s.last(x))
        return x @ s.emb.weight.t(), torch.stack(auxes).sum(), torch.stack(usage)
model = MoDLM()
opt = torch.optim.AdamW(model.parameters(), lr=2e-3, weight_decay=0.05)
g = torch.Generator().manual_seed(1)
losses = []
for step in range(5):
    ids = torch.randint(0, V, (B, T + 1), generator=g)
    ids[:, 1::3] = (ids[:, 0:-1:3] * 7 + 3) % V        # some learnable structure
    logits, aux, usage = model(ids[:, :-1])
    ce = F.cross_entropy(logits.reshape(-1, V), ids[:, 1:].reshape(-1))
    loss = ce + 0.1 * aux
    opt.zero_grad(set_to_none=True); loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0); opt.step()
    losses += [ce.detach(), aux.detach(), usage[:, ::16].flatten()[:8].sum()]
report(policy, [model], losses)
