# Untuned: a decoder-only language model with a large vocabulary (8192) whose output projection
# and cross-entropy are computed in chunks over the sequence, the way memory-saving LM trainers do
# it: the final hidden states are split with torch.split along time and each chunk's
# logits-and-loss runs under torch.utils.checkpoint.checkpoint(use_reentrant=False), so the full
# B x T x V logits never exist at once (each chunk's logits are rebuilt in backward). The output
# projection is tied to the input embedding (F.linear(h, emb.weight), the weight read by every
# chunk and by the embedding lookup); F.cross_entropy with label_smoothing=0.1, ignore_index=-100
# on right-padding (sequences of random lengths) and reduction="sum", divided by the count of valid
# tokens; a z-loss on logsumexp inside the chunk. Pre-norm blocks with causal SDPA and a learned
# position table. AdamW with decoupled weight decay on matrices only, a linear warmup. Four steps.
# CHUNKBW=1: each chunk's loss is backpropagated at once into a detached leaf copy of the hidden
# states (hd.grad accumulates over the chunks, the tied weight's .grad too), then h.backward(hd.grad).
import os, torch, torch.nn as nn, torch.nn.functional as F
from torch.utils.checkpoint import checkpoint
from common import setup, report
policy = setup()
torch.use_deterministic_algorithms(True)
V, D, H, L, B, T, CH = 8192, 256, 4, 3, 16, 128, 16
CHUNKBW = os.environ.get("CHUNKBW") == "1"
class Block(nn.Module):
    def __init__(s):
        super().__init__()
        s.n1, s.n2 = nn.LayerNorm(D), nn.LayerNorm(D)
        s.qkv, s.proj = nn.Linear(D, 3 * D), nn.Linear(D, D)
        s.mlp = nn.Sequential(nn.Linear(D, 4 * D), nn.GELU(), nn.Linear(4 * D, D))
    def forward(s, x):
        b, t, d = x.shape
        q, k, v = s.qkv(s.n1(x)).view(b, t, 3, H, d // H).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + s.proj(a.transpose(1, 2).reshape(b, t, d))
        return x + s.mlp(s.n2(x))
class LM(nn.Module):
    def __init__(s):
        super().__init__()
        s.emb = nn.Embedding(V, D); s.pos = nn.Parameter(torch.randn(T, D) * 0.02)
        s.blocks = nn.ModuleList(Block() for _ in range(L)); s.norm = nn.LayerNorm(D)
        nn.init.normal_(s.emb.weight, std=0.02)
    def forward(s, ids):
        x = s.emb(ids) + s.pos[: ids.shape[1]]
        for blk in s.blocks: x = blk(x)
        return s.norm(x)
def chunk_loss(h, w, y):
    logits = F.linear(h, w)                                   # tied head: chunk x V
    ce = F.cross_entropy(logits.reshape(-1, V), y.reshape(-1), ignore_index=-100,
                         label_smoothing=0.1, reduction="sum")
    lse = torch.logsumexp(logits, -1)
    z = (lse.square() * (y != -100)).sum()
    return ce, z
model = LM()
decay = [p for n, p in model.named_parameters() if p.dim() == 2 and n != "pos"]
rest = [p for n, p in model.named_parameters() if not (p.dim() == 2 and n != "pos")]
opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": rest, "weight_decay": 0.0}], lr=1e-3)
sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda i: min(1.0, (i + 1) / 3))
g = torch.Generator().manual_seed(1)
losses = []
for step in range(4):
    ids = torch.randint(0, V, (B, T + 1), generator=g)
    lens = torch.randint(T // 2, T + 1, (B,), generator=g)
    labels = ids[:, 1:].clone()
    labels[torch.arange(T)[None, :] >= lens[:, None]] = -100   # right padding ignored
    h = model(ids[:, :-1])
    ntok = (labels != -100).sum()
    ce_sum, z_sum = 0.0, 0.0
    opt.zero_grad(set_to_none=True)
    if CHUNKBW:                       # backward chunk by chunk into a detached leaf, then the trunk
        hd = h.detach().requires_grad_()
        for hc, yc in zip(torch.split(hd, CH, dim=1), torch.split(labels, CH, dim=1)):
            ce, z = checkpoint(chunk_loss, hc, model.emb.weight, yc, use_reentrant=False)
            ((ce + 1e-4 * z) / ntok).backward()
            ce_sum = ce_sum + ce.detach(); z_sum = z_sum + z.detach()
        h.backward(hd.grad)
        loss = ce_sum / ntok + 1e-4 * z_sum / ntok
    else:
        for hc, yc in zip(torch.split(h, CH, dim=1), torch.split(labels, CH, dim=1)):
            ce, z = checkpoint(chunk_loss, hc, model.emb.weight, yc, use_reentrant=False)
            ce_sum = ce_sum + ce; z_sum = z_sum + z
        loss = ce_sum / ntok + 1e-4 * z_sum / ntok
        loss.backward()
    opt.step(); sched.step()
    losses += [loss.detach(), ce_sum.detach() / ntok]
report(policy, [model], losses)
