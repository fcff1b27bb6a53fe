# Untuned: a RetNet-style language model. Multi-scale retention with one decay gamma per head:
# the decay mask from torch.arange differences, `pow`, `tril` and masked_fill; xPos rotation of
# queries and keys by even/odd channels taken with strided slicing and joined back by
# torch.stack(...).flatten(-2); a per-head GroupNorm on the retention output and a swish gate.
# Each step trains the sum of two losses from the same weights: the parallel form, and the
# chunkwise-recurrent form (a Python loop over chunks carrying a state updated as
# state * decay + k^T v, by an in-place mul_ on a clone). Tied embeddings (the head's weight is
# the embedding's), AdamW with weight decay on the matrices only, cosine LR schedule, 3 steps.
import math, torch, torch.nn as nn, torch.nn.functional as F
from common import setup, report
policy = setup()
V, D, H, L, B, LAYERS, CHUNK = 512, 128, 4, 256, 2, 2, 64
DK, DV = D // H, 2 * D // H
def xpos(x, sign):
    """Rotate pairs of channels (even, odd) by position-dependent angles, scaled xPos-style."""
    n = torch.arange(x.shape[-2], dtype=torch.float32)[:, None]
    half = torch.arange(0, DK, 2, dtype=torch.float32)
    theta = n * 10000 ** (-half / DK)
    scale = ((half + 0.4 * DK) / (1.4 * DK)) ** (sign * n / 512)
    x1, x2 = x[..., ::2], x[..., 1::2]
    c, s = theta.cos() * scale, theta.sin() * scale
    return torch.stack((x1 * c - x2 * s, x1 * s + x2 * c), dim=-1).flatten(-2)
class Retention(nn.Module):
    def __init__(s):
        super().__init__()
        s.q, s.k, s.v, s.g = nn.Linear(D, D, bias=False), nn.Linear(D, D, bias=False), nn.Linear(D, H * DV, bias=False), nn.Linear(D, H * DV, bias=False)
        s.o = nn.Linear(H * DV, D, bias=False)
        s.gn = nn.GroupNorm(H, H * DV)
        s.register_buffer("gamma", 1 - 2.0 ** (-5 - torch.arange(H, dtype=torch.float32)))
    def heads(s, x):
        b, l, _ = x.shape
        q = xpos(s.q(x).view(b, l, H, DK).transpose(1, 2), 1) * DK ** -0.5
        k = xpos(s.k(x).view(b, l, H, DK).transpose(1, 2), -1)
        v = s.v(x).view(b, l, H, DV).transpose(1, 2)
        return q, k, v
    def decay_mask(s, l):
        n = torch.arange(l)
        diff = (n[:, None] - n[None, :]).float()
        causal = torch.ones(l, l, dtype=torch.bool).tril()
        mask = s.gamma[:, None, None].pow(diff.masked_fill(~causal, 0))
        return mask.masked_fill(~causal, 0)                                  # (H, l, l)
    def parallel(s, x):
        q, k, v = s.heads(x)
        ret = (q @ k.transpose(-1, -2)) * s.decay_mask(x.shape[1])
        return ret @ v                                                       # (B, H, L, DV)
    def chunkwise(s, x):
        q, k, v = s.heads(x)
        b = x.shape[0]
        inner = s.decay_mask(CHUNK)
        j = torch.arange(CHUNK, dtype=torch.float32)
        g = s.gamma[:, None]
        q_decay = g.pow(j + 1)[..., None]                                    # (H, C, 1)
        k_decay = g.pow(CHUNK - 1 - j)[..., None]
        chunk_decay = s.gamma.pow(CHUNK)[:, None, None]
        state = torch.zeros(b, H, DK, DV)
        outs = []
        for c in range(L // CHUNK):
            sl = slice(c * CHUNK, (c + 1) * CHUNK)
            qc, kc, vc = q[:, :, sl], k[:, :, sl], v[:, :, sl]
            y = ((qc @ kc.transpose(-1, -2)) * inner) @ vc + (qc * q_decay) @ state
            outs.append(y)
            new = state.clone()
            new.mul_(chunk_decay)
            state = new + (kc * k_decay).transpose(-1, -2) @ vc
        return torch.cat(outs, dim=2)
    def forward(s, x, chunked):
        y = s.chunkwise(x) if chunked else s.parallel(x)
        b, _, l, _ = y.shape
        y = s.gn(y.transpose(1, 2).reshape(b * l, H * DV)).view(b, l, H * DV)
        return s.o(F.silu(s.g(x)) * y)
class RetNet(nn.Module):
    def __init__(s):
        super().__init__()
        s.emb = nn.Embedding(V, D)
        s.layers = nn.ModuleList(nn.ModuleDict(dict(ln1=nn.LayerNorm(D), ret=Retention(), ln2=nn.LayerNorm(D),
                                 ffn=nn.Sequential(nn.Linear(D, 4 * D), nn.GELU(), nn.Linear(4 * D, D)))) for _ in range(LAYERS))
        s.ln = nn.LayerNorm(D)
        s.head = nn.Linear(D, V, bias=False)
        s.head.weight = s.emb.weight
        nn.init.normal_(s.emb.weight, std=D ** -0.5)
    def forward(s, idx, chunked=False):
        x = s.emb(idx) * math.sqrt(D)
        for blk in s.layers:
            x = x + blk["ret"](blk["ln1"](x), chunked)
            x = x + blk["ffn"](blk["ln2"](x))
        return s.head(s.ln(x))
model = RetNet()
decay = [p for n, p in model.named_parameters() if p.dim() == 2 and "emb" not in n]
no_decay = [p for n, p in model.named_parameters() if not (p.dim() == 2 and "emb" not in n)]
opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.05}, {"params": no_decay, "weight_decay": 0.0}], lr=2e-3, betas=(0.9, 0.98))
sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=3, eta_min=1e-4)
gen = torch.Generator().manual_seed(11)
losses = []
for step in range(3):
    seq = torch.randint(0, V, (B, L + 1), generator=gen)
    seq[:, 2::4] = (seq[:, 0:-2:4] + 1) % V              # learnable: a token two back, plus one
    logits = model(seq[:, :-1])
    logits_c = model(seq[:, :-1], chunked=True)
    tgt = seq[:, 1:].reshape(-1)
    loss_p = F.cross_entropy(logits.reshape(-1, V), tgt)
    loss_c = F.cross_entropy(logits_c.reshape(-1, V), tgt)
    loss = loss_p + loss_c
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step(); sched.step()
    losses += [loss_p.detach(), loss_c.detach(), (logits - logits_c).detach().abs().max()]
report(policy, [model], losses)
