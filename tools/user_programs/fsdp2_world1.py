# Untuned: FSDP2 (torch.distributed.fsdp.fully_shard) launched the way users do, in one process
# (world_size=1, gloo, tcp:// init on a free port): a small pre-norm transformer LM with every
# block sharded on its own and then the root (reshard_after_forward=True: each block's unsharded
# parameters are freed after its forward by storage resize_(0) and all-gathered again for
# backward; RAF=0: kept), parameters that are DTensors, AdamW over them, clip_grad_norm_ on DTensor
# gradients, set_requires_gradient_sync(False) on the first of two micro-batches, 3 steps; the
# final weights gathered by full_tensor() into a plain copy for the check; the process group is
# destroyed after report().
import os, socket, torch, torch.nn as nn, torch.nn.functional as F
import torch.distributed as dist
from common import setup, report
try:
    from torch.distributed.fsdp import fully_shard
except ImportError:
    from torch.distributed._composable.fsdp import fully_shard
policy = setup()
torch.use_deterministic_algorithms(True)

def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0)); return s.getsockname()[1]
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)

class Block(nn.Module):
    def __init__(s, d, h):
        super().__init__()
        s.h = h; s.n1 = nn.LayerNorm(d); s.qkv = nn.Linear(d, 3 * d); s.o = nn.Linear(d, d)
        s.n2 = nn.LayerNorm(d); s.fc1 = nn.Linear(d, 4 * d); s.fc2 = nn.Linear(4 * d, d)
    def forward(s, x):
        B, T, D = x.shape
        q, k, v = s.qkv(s.n1(x)).view(B, T, 3, s.h, D // s.h).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + s.o(a.transpose(1, 2).reshape(B, T, D))
        return x + s.fc2(F.gelu(s.fc1(s.n2(x))))
class LM(nn.Module):
    def __init__(s, V=512, d=128, L=4, h=4, T=128):
        super().__init__()
        s.emb = nn.Embedding(V, d); s.pos = nn.Parameter(torch.randn(T, d) * 0.02)
        s.blocks = nn.ModuleList(Block(d, h) for _ in range(L)); s.nf = nn.LayerNorm(d)
        s.head = nn.Linear(d, V, bias=False)
    def forward(s, t):
        x = s.emb(t) + s.pos[: t.shape[1]]
        for b in s.blocks: x = b(x)
        return s.head(s.nf(x))

model = LM()
raf = os.environ.get("RAF", "1") == "1"
for b in model.blocks:
    fully_shard(b, reshard_after_forward=raf)
fully_shard(model, reshard_after_forward=raf)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
g = torch.Generator().manual_seed(1)
losses = []
for step in range(3):
    total = 0.0
    for micro in range(2):
        t = torch.randint(0, 512, (16, 129), generator=g)
        model.set_requires_gradient_sync(micro == 1)
        logits = model(t[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), t[:, 1:].reshape(-1)) / 2
        loss.backward()
        total += loss.detach()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    opt.zero_grad()
    losses.append(total)
full = {k: v.full_tensor() if hasattr(v, "full_tensor") else v for k, v in model.state_dict().items()}
plain = LM(); plain.load_state_dict(full)
report(policy, [plain], losses)
dist.destroy_process_group()
