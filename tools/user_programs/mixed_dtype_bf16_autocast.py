# Untuned: mixed dtypes by hand on a token classifier (batch 256 x 16 tokens x width 256). The
# forward only (not backward) runs under torch.autocast("cpu", dtype=torch.bfloat16): an fp32
# backbone of MLP blocks whose Linear layers autocast to bf16; inside it an attention pooling forced
# to float32 by torch.autocast("cpu", enabled=False) (inputs .float(), LayerNorm, a softmax over
# tokens, a weighted sum); an "adapter" submodule converted to bfloat16 with .to(torch.bfloat16)
# whose optimiser works on fp32 master copies kept by hand (grads copied p.grad.float() into the
# masters' .grad, the step on the masters, then p.copy_(master) under no_grad and p.grad = None);
# the logits cast to float64 and the loss (cross entropy plus an MSE on a float64 regression target
# and a float64 logsumexp penalty) computed in float64. Adam on the fp32 part, SGD with momentum on
# the masters. Four steps.
import torch, torch.nn as nn, torch.nn.functional as F
from common import setup, report
policy = setup()
torch.use_deterministic_algorithms(True)
B, L, DIN, D, NC = 256, 16, 64, 256, 20
class Block(nn.Module):
    def __init__(s):
        super().__init__(); s.ln = nn.LayerNorm(D); s.fc1 = nn.Linear(D, 2 * D); s.fc2 = nn.Linear(2 * D, D)
    def forward(s, x):
        return x + s.fc2(F.gelu(s.fc1(s.ln(x))))
class Model(nn.Module):
    def __init__(s):
        super().__init__()
        s.inp = nn.Linear(DIN, D)
        s.blocks = nn.ModuleList(Block() for _ in range(3))
        s.pool_ln = nn.LayerNorm(D); s.pool_q = nn.Linear(D, 1)
        s.adapter = nn.Sequential(nn.Linear(D, D), nn.SiLU(), nn.Linear(D, D)).to(torch.bfloat16)
        s.head = nn.Linear(D, NC); s.reg = nn.Linear(D, 1)
    def forward(s, x):
        h = s.inp(x)
        for b in s.blocks: h = b(h)
        with torch.autocast("cpu", enabled=False):
            h32 = s.pool_ln(h.float())
            w = torch.softmax(s.pool_q(h32).squeeze(-1), dim=-1)
            pooled = (w.unsqueeze(-1) * h32).sum(1)
            a = s.adapter(pooled.to(torch.bfloat16))
        z = pooled + a.float()
        return s.head(z), s.reg(z).squeeze(-1), w
model = Model()
adapter_params = list(model.adapter.parameters())
master = [p.detach().clone().float().requires_grad_() for p in adapter_params]
fp32_params = [p for n, p in model.named_parameters() if not n.startswith("adapter.")]
opt = torch.optim.Adam(fp32_params, lr=1e-3)
opt_m = torch.optim.SGD(master, lr=0.05, momentum=0.9)
g = torch.Generator().manual_seed(1)
losses = []
for step in range(4):
    x = torch.randn(B, L, DIN, generator=g)
    y = torch.randint(0, NC, (B,), generator=g)
    t = x[:, :, 0].mean(1, dtype=torch.float64) + 0.1 * torch.randn(B, generator=g, dtype=torch.float64)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits, r, w = model(x)
    logits64 = logits.double()
    ce = F.cross_entropy(logits64, y)
    mse = F.mse_loss(r.double(), t)
    z_pen = torch.logsumexp(logits64, dim=-1).square().mean()
    loss = ce + 0.5 * mse + 1e-3 * z_pen
    opt.zero_grad(); opt_m.zero_grad()
    loss.backward()
    for m, p in zip(master, adapter_params):
        m.grad = p.grad.float()
        p.grad = None
    opt.step(); opt_m.step()
    with torch.no_grad():
        for m, p in zip(master, adapter_params): p.copy_(m)
    losses += [loss.detach(), ce.detach(), mse.detach(), w.max().float().detach()]
report(policy, [model], losses + [m.detach().sum() for m in master])
