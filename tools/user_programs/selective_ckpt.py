# Untuned: selective activation checkpointing (PyTorch >= 2.4): each block runs under
# torch.utils.checkpoint.checkpoint(use_reentrant=False, context_fn=partial(
# create_selective_checkpoint_contexts, policy_fn)), where policy_fn saves aten.mm/addmm outputs
# (MUST_SAVE) and prefers to recompute everything else, dropout included (the RNG state is
# restored for the recomputation). Blocks: pre-LN attention written with matmul + softmax and a
# GELU MLP. The loss adds a forward-mode AD term: torch.func.jvp of a small function of the
# model's output along a fixed direction (reverse over forward). AdamW, 3 steps.
import functools, math, torch, torch.nn as nn, torch.nn.functional as F
from torch.utils.checkpoint import checkpoint, create_selective_checkpoint_contexts, CheckpointPolicy
from common import setup, report
policy = setup()

def policy_fn(ctx, op, *args, **kwargs):
    if op in (torch.ops.aten.mm.default, torch.ops.aten.addmm.default):
        return CheckpointPolicy.MUST_SAVE
    return CheckpointPolicy.PREFER_RECOMPUTE
context_fn = functools.partial(create_selective_checkpoint_contexts, policy_fn)

class Block(nn.Module):
    def __init__(self, d=256, heads=4, p=0.1):
        super().__init__()
        self.h = heads
        self.ln1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        self.fc1 = nn.Linear(d, 4 * d)
        self.fc2 = nn.Linear(4 * d, d)
        self.drop = nn.Dropout(p)
    def forward(self, x):
        B, T, D = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(B, T, 3, self.h, D // self.h).permute(2, 0, 3, 1, 4)
        att = F.softmax(q @ k.transpose(-2, -1) / math.sqrt(D // self.h), dim=-1)
        a = (self.drop(att) @ v).transpose(1, 2).reshape(B, T, D)
        x = x + self.drop(self.proj(a))
        return x + self.drop(self.fc2(F.gelu(self.fc1(self.ln2(x)))))

class Net(nn.Module):
    def __init__(self, d_in=64, d=256, layers=4, n_out=32):
        super().__init__()
        self.inp = nn.Linear(d_in, d)
        self.blocks = nn.ModuleList(Block(d) for _ in range(layers))
        self.ln = nn.LayerNorm(d)
        self.out = nn.Linear(d, n_out)
    def forward(self, x):
        h = self.inp(x)
        for blk in self.blocks:
            h = checkpoint(blk, h, use_reentrant=False, context_fn=context_fn)
        return self.out(self.ln(h))

def smoothness(z):
    return torch.tanh(z).pow(2).sum(-1)

model = Net()
opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
g = torch.Generator().manual_seed(1)
losses = []
for step in range(3):
    x = torch.randn(16, 128, 64, generator=g)
    target = torch.randn(16, 128, 32, generator=g)
    direction = torch.randn(16, 128, 32, generator=g)
    pred = model(x)
    _, jvp_out = torch.func.jvp(smoothness, (pred,), (direction,))
    loss = F.mse_loss(pred, target) + 1e-3 * jvp_out.pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    losses.append(loss.detach())
report(policy, [model], losses)
