# Untuned: the memory-saving tricks users write by hand, together. A pre-LN MLP/attention stack
# where block 0 runs under torch.autograd.graph.saved_tensors_hooks packing every saved float32
# tensor to float16 (unpacked back to its dtype), block 1 under torch.autograd.graph.save_on_cpu()
# (copies to a host tensor), block 2 under hand-written hooks that pack to a detached clone and a
# version tag; block 3's MLP is a custom autograd.Function that saves only its inputs (x, w1, b1,
# w2) and recomputes the hidden layer in backward under enable_grad with torch.autograd.grad; blocks
# 4-5 run under torch.utils.checkpoint(use_reentrant=False, preserve_rng_state=True) with dropout
# inside. Each step, between forward and backward, a detached activation is logged with .tolist(),
# .numpy() (its sum kept) and torch.save into an io.BytesIO then torch.load'ed back. AdamW, 4 steps.
import io, torch, torch.nn as nn, torch.nn.functional as F
from torch.utils.checkpoint import checkpoint
from common import setup, report
policy = setup()
torch.use_deterministic_algorithms(True)
B, T, D, C = 48, 64, 128, 10
def pack_fp16(t): return (t.dtype, t.to(torch.float16)) if t.dtype == torch.float32 else (None, t)
def unpack_fp16(p): return p[1].to(p[0]) if p[0] is not None else p[1]
def pack_clone(t): return (t._version, t.detach().clone())
def unpack_clone(p): return p[1]
class RecomputeMLP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w1, b1, w2):
        ctx.save_for_backward(x, w1, b1, w2)
        return F.linear(F.gelu(F.linear(x, w1, b1)), w2)
    @staticmethod
    def backward(ctx, go):
        x, w1, b1, w2 = ctx.saved_tensors
        with torch.enable_grad():
            x_ = x.detach().requires_grad_()
            w1_, b1_, w2_ = (t.detach().requires_grad_() for t in (w1, b1, w2))
            y = F.linear(F.gelu(F.linear(x_, w1_, b1_)), w2_)
            return torch.autograd.grad(y, (x_, w1_, b1_, w2_), go)
class Block(nn.Module):
    def __init__(s, p=0.1):
        super().__init__()
        s.ln1 = nn.LayerNorm(D); s.qkv = nn.Linear(D, 3 * D); s.o = nn.Linear(D, D)
        s.ln2 = nn.LayerNorm(D); s.f1 = nn.Linear(D, 3 * D); s.f2 = nn.Linear(3 * D, D, bias=False)
        s.p = p; s.custom = False
    def forward(s, h):
        q, k, v = s.qkv(s.ln1(h)).view(h.shape[0], T, 3, 4, D // 4).permute(2, 0, 3, 1, 4)
        a = F.dropout(torch.softmax(q @ k.transpose(-1, -2) / (D // 4) ** 0.5, -1), s.p, s.training)
        h = h + s.o((a @ v).transpose(1, 2).reshape(h.shape))
        z = s.ln2(h)
        if s.custom: m = RecomputeMLP.apply(z, s.f1.weight, s.f1.bias, s.f2.weight)
        else: m = s.f2(F.dropout(F.gelu(s.f1(z)), s.p, s.training))
        return h + m
class Net(nn.Module):
    def __init__(s):
        super().__init__()
        s.inp = nn.Linear(32, D); s.blocks = nn.ModuleList([Block() for _ in range(6)]); s.head = nn.Linear(D, C)
        s.blocks[3].custom = True
    def forward(s, x):
        h = s.inp(x)
        with torch.autograd.graph.saved_tensors_hooks(pack_fp16, unpack_fp16): h = s.blocks[0](h)
        with torch.autograd.graph.save_on_cpu(): h = s.blocks[1](h)
        with torch.autograd.graph.saved_tensors_hooks(pack_clone, unpack_clone): h = s.blocks[2](h)
        h = s.blocks[3](h)
        for b in s.blocks[4:]: h = checkpoint(b, h, use_reentrant=False, preserve_rng_state=True)
        return s.head(h.mean(1)), h
model = Net()
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
g = torch.Generator().manual_seed(1)
losses = []
for step in range(4):
    x = torch.randn(B, T, 32, generator=g); y = torch.randint(0, C, (B,), generator=g)
    logits, h = model(x)
    loss = F.cross_entropy(logits, y)
    act = h.detach()[:2, 0, :8]
    rows = act.tolist(); arr = act.numpy()
    buf = io.BytesIO(); torch.save({"act": h.detach()[0], "step": step}, buf); buf.seek(0)
    back = torch.load(buf)
    losses += [torch.tensor(sum(map(sum, rows))), torch.tensor(float(arr.sum())), back["act"].square().sum()]
    opt.zero_grad()
    loss.backward()
    opt.step()
    losses += [loss.detach(), h.detach().square().sum()]
report(policy, [model], losses)
