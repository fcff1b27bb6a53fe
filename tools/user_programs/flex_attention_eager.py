# Untuned: FlexAttention without torch.compile on the CPU. torch 2.13's flex_attention refuses
# backward on the CPU ("FlexAttention does not support backward on CPU"), so, as a user would, the
# training path writes the same masks by hand for SDPA: the mask_mods (causal, a sliding window of
# 48, a document mask over packed sequences reading a per-batch doc-id tensor) are combined with
# and_masks and materialised by flex_attention.create_mask into a B x 1 x T x T bool mask, and the
# score_mod (ALiBi: minus a per-head slope times the distance, plus a learned per-head bias table
# indexed by clamped distance) is written as an additive float bias; the bias is masked_fill'ed
# with -inf and passed as SDPA's attn_mask, so gradients reach the learned bias table. Each step
# then runs an eager flex_attention forward under no_grad (its dense CPU path, vmapped score_mod)
# with a BlockMask from create_block_mask (block size 32, _compile=False) and the ALiBi score_mod
# on the detached q/k/v of every layer, and its deviation from the SDPA output and an eval loss
# join the reported values. AdamW, four steps.
import warnings
import torch, torch.nn as nn, torch.nn.functional as F
from torch.nn.attention.flex_attention import flex_attention, create_block_mask, create_mask, and_masks
from common import setup, report
policy = setup()
torch.use_deterministic_algorithms(True)
warnings.filterwarnings("ignore")
V, D, H, L, B, T, W, NB = 512, 256, 8, 3, 16, 128, 48, 64
slopes = torch.tensor([2.0 ** (-8 * (i + 1) / H) for i in range(H)])
def causal(b, h, q, k): return q >= k
def window(b, h, q, k): return q - k < W
class Block(nn.Module):
    def __init__(s):
        super().__init__()
        s.n1, s.n2 = nn.LayerNorm(D), nn.LayerNorm(D)
        s.qkv, s.o = nn.Linear(D, 3 * D), nn.Linear(D, D)
        s.rel = nn.Parameter(torch.zeros(H, NB))               # learned relative bias per head
        s.ff = nn.Sequential(nn.Linear(D, 4 * D), nn.SiLU(), nn.Linear(4 * D, D))
    def forward(s, x, mask, dist, flex_mask, probe):
        b, t, d = x.shape
        q, k, v = s.qkv(s.n1(x)).view(b, t, 3, H, d // H).permute(2, 0, 3, 1, 4)
        bias = -slopes[:, None, None] * dist.float() + s.rel[:, dist.clamp(0, NB - 1)]   # H x T x T
        bias = bias[None].masked_fill(~mask, float("-inf"))                             # B x H x T x T
        a = F.scaled_dot_product_attention(q, k, v, attn_mask=bias)
        if probe is not None:
            rel = s.rel.detach()
            def score_mod(score, bb, hh, qi, ki):
                dd = qi - ki
                return score - slopes[hh] * dd + rel[hh, dd.clamp(0, NB - 1)]
            with torch.no_grad():
                fa = flex_attention(q.detach(), k.detach(), v.detach(), score_mod=score_mod, block_mask=flex_mask)
            probe.append((fa - a.detach()).abs().max())
        x = x + s.o(a.transpose(1, 2).reshape(b, t, d))
        return x + s.ff(s.n2(x))
class LM(nn.Module):
    def __init__(s):
        super().__init__()
        s.emb = nn.Embedding(V, D); s.blocks = nn.ModuleList(Block() for _ in range(L))
        s.norm = nn.LayerNorm(D); s.head = nn.Linear(D, V)
    def forward(s, ids, mask, dist, flex_mask=None, probe=None):
        x = s.emb(ids)
        for blk in s.blocks: x = blk(x, mask, dist, flex_mask, probe)
        return s.head(s.norm(x))
model = LM()
opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
g = torch.Generator().manual_seed(1)
pos = torch.arange(T)
dist = pos[:, None] - pos[None, :]
losses = []
for step in range(4):
    ids = torch.randint(0, V, (B, T + 1), generator=g)
    cuts = torch.randint(1, T, (B, 3), generator=g)
    doc = (pos[None, :, None] >= cuts[:, None, :]).sum(-1)      # B x T document ids (packed)
    def same_doc(b, h, q, k): return doc[b, q] == doc[b, k]
    mask_mod = and_masks(causal, window, same_doc)
    mask = create_mask(mask_mod, B, 1, T, T, device="cpu")      # B x 1 x T x T bool
    logits = model(ids[:, :-1], mask, dist)
    loss = F.cross_entropy(logits.reshape(-1, V), ids[:, 1:].reshape(-1))
    opt.zero_grad(); loss.backward(); opt.step()
    # eval with FlexAttention's eager forward beside the SDPA path
    model.eval()
    bm = create_block_mask(mask_mod, B, None, T, T, device="cpu", BLOCK_SIZE=32, _compile=False)
    probe = []
    with torch.no_grad():
        el = F.cross_entropy(model(ids[:, :-1], mask, dist, bm, probe).reshape(-1, V), ids[:, 1:].reshape(-1))
    model.train()
    losses += [loss.detach(), el, torch.stack(probe).max()]
report(policy, [model], losses)
