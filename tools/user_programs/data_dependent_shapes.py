# Untuned: a token-routing model whose shapes depend on the data, gradients flowing through every
# data-dependent op. Per step: tokens above a learned score threshold are kept by boolean indexing
# (`h[keep]`) and by `nonzero` indices, a `masked_select` of the gated values, `torch.unique(
# return_inverse=True, return_counts=True)` over bucket ids from `bucketize` of a projection against fixed
# boundaries, per-bucket means by `index_add` over the inverse, `repeat_interleave` with the tensor
# counts to broadcast them back, `topk` with k read by `.item()` from the number kept, and the
# results scattered back into the full sequence by `index_put` (boolean mask) and `masked_scatter`.
# AdamW, five steps.
import torch, torch.nn as nn, torch.nn.functional as F
from common import setup, report
policy = setup()
torch.use_deterministic_algorithms(True)
B, T, D, NC, NBK = 32, 128, 192, 10, 24
class Router(nn.Module):
    def __init__(s):
        super().__init__()
        s.score = nn.Linear(D, 1); s.ff = nn.Sequential(nn.Linear(D, 3 * D), nn.GELU(), nn.Linear(3 * D, D))
        s.bucket = nn.Linear(D, 1); s.bmix = nn.Linear(2 * D, D); s.norm = nn.LayerNorm(D)
    def forward(s, h):
        flat = h.reshape(-1, D)
        sc = s.score(flat).squeeze(-1)
        keep = sc > sc.median()                                   # data-dependent mask
        kept = flat[keep]                                         # boolean indexing
        idx = keep.nonzero().squeeze(-1)
        upd = s.ff(kept) * torch.sigmoid(sc[idx])[:, None]
        out = flat.index_put((keep,), flat[keep] + upd)           # index_put with a boolean mask
        gated = torch.masked_select(out, (out > 0).detach())      # 1-D, data-dependent length
        bounds = torch.linspace(-2, 2, NBK - 1)
        bid = torch.bucketize(s.bucket(out).squeeze(-1).detach(), bounds)
        uniq, inv, cnt = torch.unique(bid, return_inverse=True, return_counts=True)
        sums = torch.zeros(uniq.numel(), D).index_add(0, inv, out)
        means = sums / cnt[:, None]
        order = torch.argsort(inv, stable=True)
        bm = torch.repeat_interleave(means, cnt, dim=0)           # counts as a tensor
        back = torch.empty_like(bm).index_copy(0, order, bm)      # bucket order -> token order
        out = out + s.bmix(torch.cat([out, back], -1))
        k = max(1, int(keep.sum().item()) // 4)                   # dynamic k
        top = torch.topk(sc, k).indices
        boost = torch.zeros_like(sc).index_put((top,), torch.sigmoid(sc[top]))
        out = out * (1 + boost[:, None])
        m2 = (sc < sc.quantile(0.1)).detach()
        out = out.masked_scatter(m2[:, None].expand_as(out), torch.tanh(out[m2]))
        return s.norm(out).reshape(h.shape), gated.mean(), float(uniq.numel())
class Model(nn.Module):
    def __init__(s):
        super().__init__()
        s.inp = nn.Linear(16, D); s.layers = nn.ModuleList([Router() for _ in range(3)]); s.head = nn.Linear(D, NC)
    def forward(s, x):
        h, aux, nb = s.inp(x), 0.0, []
        for l in s.layers:
            h2, a, n = l(h); h = h + h2; aux = aux + a; nb.append(n)
        return s.head(h.mean(1)), aux, nb
model = Model()
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
g = torch.Generator().manual_seed(1)
losses = []
for step in range(5):
    x = torch.randn(B, T, 16, generator=g); y = torch.randint(0, NC, (B,), generator=g)
    logits, aux, nb = model(x)
    loss = F.cross_entropy(logits, y) + 0.01 * aux
    opt.zero_grad(); loss.backward(); opt.step()
    losses += [loss.detach(), torch.tensor(sum(nb))]
report(policy, [model], losses)
