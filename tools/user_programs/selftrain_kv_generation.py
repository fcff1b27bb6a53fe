# Untuned: self-training of a small decoder-only LM. Teacher-forced training of a pre-norm
# transformer (RoPE by rotate-half, POS=learned: learned positions; causal SDPA with dropout_p,
# dropout on the residual branches); every step, under model.eval() and torch.no_grad(), the model
# generates 24 tokens greedily from prompts cut from the batch, with a KV cache grown by torch.cat
# per token (PREALLOC=1: a preallocated cache written by slice assignment for the prompt and
# index_copy_ per token), then model.train() again; the generated sequences become an extra
# target batch for the *next* step's loss. AdamW with gradient clipping, 4 steps.
import math, os, torch, torch.nn as nn, torch.nn.functional as F
from common import setup, report
policy = setup()
V, D, H, LAYERS, T, B, GB, PROMPT, GEN, P = 512, 128, 4, 4, 128, 16, 8, 16, 24, 0.1
HD = D // H
PREALLOC = os.environ.get("PREALLOC") == "1"
LEARNED = os.environ.get("POS") == "learned"
MAXLEN = max(T, PROMPT + GEN)
inv = 1.0 / 10000 ** (torch.arange(0, HD, 2).float() / HD)
ang = torch.arange(MAXLEN).float()[:, None] * inv[None]
COS, SIN = torch.cat([ang.cos(), ang.cos()], -1), torch.cat([ang.sin(), ang.sin()], -1)
def rope(x, pos):                       # x (B, H, L, HD), pos (L,)
    x1, x2 = x[..., :HD // 2], x[..., HD // 2:]
    return x * COS[pos] + torch.cat([-x2, x1], -1) * SIN[pos]
class Block(nn.Module):
    def __init__(s):
        super().__init__()
        s.ln1, s.ln2 = nn.LayerNorm(D), nn.LayerNorm(D)
        s.qkv, s.proj = nn.Linear(D, 3 * D), nn.Linear(D, D)
        s.mlp = nn.Sequential(nn.Linear(D, 4 * D), nn.GELU(), nn.Linear(4 * D, D))
        s.drop = nn.Dropout(P)
    def forward(s, x, pos, cache=None, at=None):
        b, l, _ = x.shape
        q, k, v = s.qkv(s.ln1(x)).view(b, l, 3, H, HD).permute(2, 0, 3, 1, 4)
        if not LEARNED: q, k = rope(q, pos), rope(k, pos)
        if cache is None:
            y = F.scaled_dot_product_attention(q, k, v, dropout_p=P if s.training else 0.0, is_causal=True)
        else:
            if PREALLOC:
                kc, vc = cache
                if l > 1: kc[:, :, :l] = k; vc[:, :, :l] = v
                else: kc.index_copy_(2, pos, k); vc.index_copy_(2, pos, v)
                k, v = kc[:, :, :at + l], vc[:, :, :at + l]
            else:
                if cache:
                    k, v = torch.cat([cache[0], k], 2), torch.cat([cache[1], v], 2)
                cache[:] = [k, v]
            y = F.scaled_dot_product_attention(q, k, v, is_causal=l > 1)
        x = x + s.drop(s.proj(y.transpose(1, 2).reshape(b, l, D)))
        return x + s.drop(s.mlp(s.ln2(x)))
class LM(nn.Module):
    def __init__(s):
        super().__init__()
        s.emb = nn.Embedding(V, D); s.pos = nn.Embedding(MAXLEN, D) if LEARNED else None
        s.blocks = nn.ModuleList(Block() for _ in range(LAYERS)); s.ln = nn.LayerNorm(D)
        s.head = nn.Linear(D, V, bias=False); s.drop = nn.Dropout(P)
    def forward(s, idx, start=0, caches=None):
        pos = torch.arange(start, start + idx.shape[1])
        x = s.emb(idx)
        if LEARNED: x = x + s.pos(pos)
        x = s.drop(x)
        for i, blk in enumerate(s.blocks):
            x = blk(x, pos, None if caches is None else caches[i], start)
        return s.head(s.ln(x))
    def generate(s, prompt, n):
        if PREALLOC:
            caches = [[torch.zeros(prompt.shape[0], H, PROMPT + n, HD) for _ in range(2)] for _ in s.blocks]
        else:
            caches = [[] for _ in s.blocks]
        logits = s(prompt, 0, caches)
        out = [prompt]
        for t in range(n):
            nxt = logits[:, -1].argmax(-1, keepdim=True)
            out.append(nxt)
            if t + 1 < n: logits = s(nxt, prompt.shape[1] + t, caches)
        return torch.cat(out, 1)
model = LM()
opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.05)
g = torch.Generator().manual_seed(11)
def batch():
    seq = torch.randint(0, V, (B, T + 1), generator=g)
    seq[:, 2::2] = (seq[:, 0:-2:2] + 7) % V           # a rule to learn: every other token
    return seq
losses, selfbatch = [], None
for step in range(4):
    model.train()
    seq = batch()
    logits = model(seq[:, :-1])
    loss = F.cross_entropy(logits.reshape(-1, V), seq[:, 1:].reshape(-1))
    if selfbatch is not None:                          # last step's generations as targets
        sl = model(selfbatch[:, :-1])
        loss = loss + 0.5 * F.cross_entropy(sl.reshape(-1, V), selfbatch[:, 1:].reshape(-1))
    opt.zero_grad()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    model.eval()
    with torch.no_grad():
        selfbatch = model.generate(seq[:GB, :PROMPT], GEN)
    model.train()
    losses += [loss.detach(), logits.detach().std(), selfbatch.sum()]
report(policy, [model], losses)
