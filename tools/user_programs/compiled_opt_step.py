"""torch.compile on the pieces around an uncompiled model, as the PyTorch recipe on compiling
the optimizer does: `@torch.compile def step(): opt.step()` over AdamW (inductor fuses the
per-parameter updates), and separately a compiled loss function (label-smoothed cross
entropy plus a z-loss on the logsumexp) called on the eager model's logits; the model (a
small pre-norm transformer LM) runs eagerly; 4 steps with a LambdaLR warmup (lr as a tensor,
so the compiled step does not recompile when it changes). DYN=1: instead,
torch.compile(model, dynamic=True) over batches whose sequence length changes each step,
with the eager optimizer and loss."""
from common import setup, report
import os, math, torch, torch.nn as nn, torch.nn.functional as F
policy = setup()
V, D, H, T, B, L = 256, 64, 4, 64, 32, 4

class Block(nn.Module):
    def __init__(s):
        super().__init__()
        s.n1 = nn.LayerNorm(D); s.qkv = nn.Linear(D, 3 * D); s.o = nn.Linear(D, D)
        s.n2 = nn.LayerNorm(D); s.fc1 = nn.Linear(D, 4 * D); s.fc2 = nn.Linear(4 * D, D)
    def forward(s, x):
        b, t, d = x.shape
        q, k, v = s.qkv(s.n1(x)).view(b, t, 3, H, d // H).permute(2, 0, 3, 1, 4)
        att = (q @ k.transpose(-2, -1)) * (d // H) ** -0.5
        att = att.masked_fill(torch.ones(t, t, dtype=torch.bool).triu(1), float("-inf")).softmax(-1)
        x = x + s.o((att @ v).transpose(1, 2).reshape(b, t, d))
        return x + s.fc2(F.gelu(s.fc1(s.n2(x))))

class LM(nn.Module):
    def __init__(s):
        super().__init__()
        s.emb = nn.Embedding(V, D); s.pos = nn.Parameter(torch.randn(T, D) * 0.02)
        s.blocks = nn.ModuleList(Block() for _ in range(L)); s.norm = nn.LayerNorm(D); s.out = nn.Linear(D, V)
    def forward(s, t):
        x = s.emb(t) + s.pos[: t.shape[1]]
        for blk in s.blocks: x = blk(x)
        return s.out(s.norm(x))

def loss_fn(logits, y):
    lse = torch.logsumexp(logits, -1)
    return F.cross_entropy(logits.reshape(-1, V), y.reshape(-1), label_smoothing=0.1) + 1e-4 * lse.pow(2).mean()

model = LM()
dyn = os.environ.get("DYN") == "1"
opt = torch.optim.AdamW(model.parameters(), lr=torch.tensor(3e-3), weight_decay=0.01)
sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda i: min(1.0, (i + 1) / 3))
if dyn:
    fwd, lossf = torch.compile(model, dynamic=True), loss_fn
    def step(): opt.step()
else:
    fwd, lossf = model, torch.compile(loss_fn)
    @torch.compile(fullgraph=False)
    def step(): opt.step()
g = torch.Generator().manual_seed(1); losses = []
for i in range(4):
    t_len = [64, 48, 56, 40][i] if dyn else T
    t = torch.randint(0, V, (B, t_len + 1), generator=g)
    loss = lossf(fwd(t[:, :-1]), t[:, 1:])
    opt.zero_grad(set_to_none=True); loss.backward(); step(); sched.step()
    losses.append(loss.detach())
report(policy, [model], losses)
