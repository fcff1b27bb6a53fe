# Untuned: deferred initialisation as torchdistx / large-model scripts write it. The whole model is
# built under `with torch.device("meta")` (no storage), then materialised by
# `model.to_empty(device=...)` and initialised by hand: `reset_parameters()` on every module that
# has one, then a custom init pass (trunc_normal_ on Linear weights, zeros on biases, orthogonal_ on
# the gate, ones/zeros on LayerNorm) and the sinusoidal positional buffer recomputed (to_empty leaves
# it uninitialised). One layer comes from `torch.nn.utils.skip_init`. After the second step a new
# head is built under the meta device mid-training, `to_empty`-ed, initialised from the old head's
# weights by `copy_` under no_grad, and handed to the optimizer by `add_param_group`. AdamW, five
# steps.
import math, torch, torch.nn as nn, torch.nn.functional as F
from common import setup, report
policy = setup()
torch.use_deterministic_algorithms(True)
dev = torch.device("cpu")
B, T, D, NC = 32, 64, 128, 16
def sinusoid(T, D):
    pos = torch.arange(T, dtype=torch.float32)[:, None]
    div = torch.exp(torch.arange(0, D, 2, dtype=torch.float32) * (-math.log(10000.0) / D))
    pe = torch.zeros(T, D)
    pe[:, 0::2] = torch.sin(pos * div); pe[:, 1::2] = torch.cos(pos * div)
    return pe
class Block(nn.Module):
    def __init__(s):
        super().__init__()
        s.n1, s.n2 = nn.LayerNorm(D), nn.LayerNorm(D)
        s.qkv = nn.Linear(D, 3 * D); s.proj = nn.Linear(D, D)
        s.up = nn.Linear(D, 4 * D); s.gate = nn.Linear(D, 4 * D, bias=False); s.down = nn.Linear(4 * D, D)
    def forward(s, x):
        q, k, v = s.qkv(s.n1(x)).chunk(3, -1)
        a = torch.softmax(q @ k.transpose(1, 2) / math.sqrt(D), -1) @ v
        x = x + s.proj(a)
        h = s.n2(x)
        return x + s.down(F.silu(s.gate(h)) * s.up(h))
class Model(nn.Module):
    def __init__(s):
        super().__init__()
        s.inp = nn.Linear(24, D)
        s.register_buffer("pe", sinusoid(T, D))
        s.blocks = nn.ModuleList([Block() for _ in range(3)])
        s.norm = nn.LayerNorm(D); s.head = nn.Linear(D, NC)
        s.extra = nn.utils.skip_init(nn.Linear, D, D)      # meta then to_empty inside
    def forward(s, x):
        h = s.inp(x) + s.pe
        for b in s.blocks: h = b(h)
        h = h + 0.1 * torch.tanh(s.extra(h))
        return s.norm(h).mean(1)
def init_(model):
    for m in model.modules():
        if hasattr(m, "reset_parameters"): m.reset_parameters()
    g = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for n, m in model.named_modules():
            if isinstance(m, nn.Linear):
                if n.endswith("gate"): nn.init.orthogonal_(m.weight, generator=g)
                else: nn.init.trunc_normal_(m.weight, std=0.02, generator=g)
                if m.bias is not None: m.bias.zero_()
            elif isinstance(m, nn.LayerNorm):
                m.weight.fill_(1.0); m.bias.zero_()
        if hasattr(model, "pe"): model.pe.copy_(sinusoid(T, D))
with torch.device("meta"):
    model = Model()
assert all(p.is_meta for n, p in model.named_parameters() if not n.startswith("extra"))
model = model.to_empty(device=dev)
init_(model)
opt = torch.optim.AdamW(model.parameters(), lr=2e-3, weight_decay=0.01)
g = torch.Generator().manual_seed(1)
losses = []
head2 = None
for step in range(5):
    x = torch.randn(B, T, 24, generator=g); y = torch.randint(0, NC, (B,), generator=g)
    f = model(x)
    logits = model.head(f) if head2 is None else 0.5 * (model.head(f) + head2(f))
    loss = F.cross_entropy(logits, y)
    opt.zero_grad(); loss.backward(); opt.step()
    losses.append(loss.detach())
    if step == 1:
        with torch.device("meta"):
            head2 = nn.Sequential(nn.Linear(D, D), nn.GELU(), nn.Linear(D, NC))
        head2.to_empty(device=dev)
        with torch.no_grad():
            nn.init.eye_(head2[0].weight); head2[0].bias.zero_()
            head2[2].weight.copy_(model.head.weight); head2[2].bias.copy_(model.head.bias)
        opt.add_param_group({"params": list(head2.parameters()), "lr": 1e-3})
report(policy, [model, head2], losses)
