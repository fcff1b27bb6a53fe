# Untuned: optimizer-in-backward as in the PyTorch tutorial "How to save memory by fusing the
# optimizer step into the backward pass": one Adam per parameter, stepped (and its grad zeroed)
# from p.register_post_accumulate_grad_hook during loss.backward(), so parameters change while
# the backward pass still runs. A small transformer-ish LM: Embedding, blocks of LayerNorm /
# Linear / GELU / attention written with matmul + softmax, dropout; weight-tied output head.
# ACT_HOOK=1: the forward also runs under torch.autograd.graph.saved_tensors_hooks with identity
# pack/unpack. 3 steps.
import os, math, torch, torch.nn as nn, torch.nn.functional as F
from common import setup, report
policy = setup()

class Attention(nn.Module):
    def __init__(self, d, heads, p):
        super().__init__()
        self.h = heads
        self.qkv = nn.Linear(d, 3 * d)
        self.out = nn.Linear(d, d)
        self.drop = nn.Dropout(p)
    def forward(self, x):
        B, T, D = x.shape
        q, k, v = self.qkv(x).split(D, dim=2)
        q = q.view(B, T, self.h, D // self.h).transpose(1, 2)
        k = k.view(B, T, self.h, D // self.h).transpose(1, 2)
        v = v.view(B, T, self.h, D // self.h).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) / math.sqrt(D // self.h)
        causal = torch.ones(T, T, dtype=torch.bool).tril()
        att = att.masked_fill(~causal, float("-inf"))
        att = self.drop(F.softmax(att, dim=-1))
        y = (att @ v).transpose(1, 2).contiguous().view(B, T, D)
        return self.drop(self.out(y))

class Block(nn.Module):
    def __init__(self, d, heads, p):
        super().__init__()
        self.ln1 = nn.LayerNorm(d)
        self.attn = Attention(d, heads, p)
        self.ln2 = nn.LayerNorm(d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d), nn.Dropout(p))
    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))

class LM(nn.Module):
    def __init__(self, vocab=512, d=128, heads=4, layers=3, ctx=128, p=0.1):
        super().__init__()
        self.tok = nn.Embedding(vocab, d)
        self.pos = nn.Embedding(ctx, d)
        self.drop = nn.Dropout(p)
        self.blocks = nn.ModuleList(Block(d, heads, p) for _ in range(layers))
        self.ln = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)
        self.head.weight = self.tok.weight
    def forward(self, idx):
        T = idx.size(1)
        x = self.drop(self.tok(idx) + self.pos(torch.arange(T)))
        for b in self.blocks:
            x = b(x)
        return self.head(self.ln(x))

model = LM()
opt_dict = {p: torch.optim.Adam([p], lr=1e-3) for p in model.parameters()}
def optimizer_hook(p):
    opt_dict[p].step()
    opt_dict[p].zero_grad()
for p in model.parameters():
    p.register_post_accumulate_grad_hook(optimizer_hook)

act_hook = os.environ.get("ACT_HOOK") == "1"
def pack(t): return t
def unpack(t): return t
g = torch.Generator().manual_seed(1)
losses = []
for step in range(3):
    idx = torch.randint(0, 512, (16, 129), generator=g)
    if act_hook:
        with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
            logits = model(idx[:, :-1])
    else:
        logits = model(idx[:, :-1])
    loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), idx[:, 1:].reshape(-1))
    loss.backward()
    losses.append(loss.detach())
report(policy, [model], losses)
