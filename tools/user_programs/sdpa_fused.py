"""A decoder with F.scaled_dot_product_attention (causal, dropout), bf16 autocast on the CPU,
AdamW(fused=True), clip_grad_norm_, a warmup schedule."""
from common import *
from torch import nn
from torch.nn import functional as F
policy = setup()
class Blk(nn.Module):
    def __init__(s, d=256, h=8):
        super().__init__()
        s.h = h; s.qkv = nn.Linear(d, 3 * d); s.o = nn.Linear(d, d); s.n1 = nn.LayerNorm(d); s.n2 = nn.LayerNorm(d)
        s.ff = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(approximate="tanh"), nn.Linear(4 * d, d), nn.Dropout(0.1))
    def forward(s, x):
        B, T, D = x.shape
        q, k, v = s.qkv(s.n1(x)).view(B, T, 3, s.h, D // s.h).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, dropout_p=0.1 if s.training else 0.0, is_causal=True)
        x = x + s.o(a.transpose(1, 2).reshape(B, T, D))
        return x + s.ff(s.n2(x))
class LM(nn.Module):
    def __init__(s, V=1000, d=256, L=4):
        super().__init__()
        s.e = nn.Embedding(V, d); s.p = nn.Parameter(torch.zeros(1, 128, d)); s.b = nn.ModuleList(Blk(d) for _ in range(L)); s.n = nn.LayerNorm(d)
    def forward(s, t):
        x = s.e(t) + s.p[:, :t.size(1)]
        for b in s.b: x = b(x)
        return s.n(x) @ s.e.weight.t()
m = LM(); opt = torch.optim.AdamW(m.parameters(), 3e-4, weight_decay=0.1, fused=True)
sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda i: min(1.0, (i + 1) / 3))
g = torch.Generator().manual_seed(1); losses = []
for step in range(3):
    t = torch.randint(0, 1000, (24, 129), generator=g)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = m(t[:, :-1])
    loss = F.cross_entropy(logits.float().reshape(-1, 1000), t[:, 1:].reshape(-1), label_smoothing=0.1)
    opt.zero_grad(set_to_none=True); loss.backward()
    torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0); opt.step(); sched.step(); losses.append(loss.item())
report(policy, [m], losses)
