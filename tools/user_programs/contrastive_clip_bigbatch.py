# Untuned: a CLIP-style dual encoder at batch 1024 on synthetic paired data. An image tower (an MLP
# over 16 flattened 48-dim patch features: per-patch Linear, GELU, mean over patches, a projection)
# and a text tower (nn.Embedding over 16 tokens with a padding mask, a masked mean, an MLP with
# LayerNorm, a projection); every embedding through F.normalize(dim=-1). A learned temperature
# nn.Parameter(log(1/0.07)) used as logit_scale.exp().clamp(max=100), and clamped in place on .data
# after each step as OpenCLIP does. The loss: the symmetric cross entropy over the 1024 x 1024
# similarity matrix (logits and logits.t(), labels arange), plus image-to-text InfoNCE whose
# negatives include 2048 text features gathered (index_select by a torch.randint index) from a
# 8192-entry memory queue; the queue is a registered buffer updated in place after each step
# (queue[ptr:ptr + B] = normalized text features, detached, under no_grad; ptr a Python int).
# AdamW with the temperature excluded from weight decay. Four steps.
import math, torch, torch.nn as nn, torch.nn.functional as F
from common import setup, report
policy = setup()
torch.use_deterministic_algorithms(True)
B, P, DP, L, V, W, D, K, NEG = 1024, 16, 48, 16, 1000, 256, 128, 8192, 2048
class ImageTower(nn.Module):
    def __init__(s):
        super().__init__()
        s.patch = nn.Linear(DP, W); s.mlp = nn.Sequential(nn.LayerNorm(W), nn.Linear(W, W), nn.GELU())
        s.proj = nn.Linear(W, D, bias=False)
    def forward(s, x):                      # B x P x DP
        h = F.gelu(s.patch(x))
        h = h + s.mlp(h)
        return s.proj(h.mean(1))
class TextTower(nn.Module):
    def __init__(s):
        super().__init__()
        s.emb = nn.Embedding(V, W, padding_idx=0)
        s.mlp = nn.Sequential(nn.Linear(W, 2 * W), nn.GELU(), nn.Linear(2 * W, W))
        s.ln = nn.LayerNorm(W); s.proj = nn.Linear(W, D, bias=False)
    def forward(s, tok):
        m = (tok != 0).unsqueeze(-1).float()
        h = s.emb(tok)
        h = (h * m).sum(1) / m.sum(1).clamp(min=1)
        h = s.ln(h + s.mlp(h))
        return s.proj(h)
class CLIP(nn.Module):
    def __init__(s):
        super().__init__()
        s.visual, s.text = ImageTower(), TextTower()
        s.logit_scale = nn.Parameter(torch.ones([]) * math.log(1 / 0.07))
        s.register_buffer("queue", F.normalize(torch.randn(K, D), dim=-1))
        s.ptr = 0
    def forward(s, img, tok):
        return F.normalize(s.visual(img), dim=-1), F.normalize(s.text(tok), dim=-1), s.logit_scale.exp().clamp(max=100)
model = CLIP()
decay = [p for n, p in model.named_parameters() if p.ndim >= 2]
no_decay = [p for n, p in model.named_parameters() if p.ndim < 2]
opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.2}, {"params": no_decay, "weight_decay": 0.0}],
                        lr=1e-3, betas=(0.9, 0.98), eps=1e-6)
g = torch.Generator().manual_seed(1)
proto = torch.randn(64, P, DP, generator=g)                     # latent "concepts" shared by both modalities
labels = torch.arange(B)
losses = []
for step in range(4):
    c = torch.randint(0, 64, (B,), generator=g)
    img = proto[c] + 0.5 * torch.randn(B, P, DP, generator=g)
    lens = torch.randint(4, L + 1, (B,), generator=g)
    tok = (c[:, None] * 13 + torch.randint(1, 40, (B, L), generator=g)) % (V - 1) + 1
    tok = tok.masked_fill(torch.arange(L)[None] >= lens[:, None], 0)
    im, tx, scale = model(img, tok)
    logits_i = scale * im @ tx.t()
    logits_t = logits_i.t()
    clip_loss = (F.cross_entropy(logits_i, labels) + F.cross_entropy(logits_t, labels)) / 2
    idx = torch.randint(0, K, (NEG,), generator=g)
    negs = model.queue.index_select(0, idx)                      # NEG x D, no grad
    logits_q = torch.cat([logits_i, scale * im @ negs.t()], dim=1)
    q_loss = F.cross_entropy(logits_q, labels)
    loss = clip_loss + 0.5 * q_loss
    opt.zero_grad(); loss.backward(); opt.step()
    with torch.no_grad():
        model.logit_scale.data.clamp_(0, math.log(100))
        model.queue[model.ptr:model.ptr + B] = tx.detach()
        model.ptr = (model.ptr + B) % K
    acc = (logits_i.argmax(1) == labels).float().mean()
    losses += [loss.detach(), clip_loss.detach(), q_loss.detach(), acc, scale.detach()]
report(policy, [model], losses)
