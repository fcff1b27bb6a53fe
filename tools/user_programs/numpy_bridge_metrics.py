# Untuned: a small attention classifier whose forward leaves the tensor world mid-way, as
# research code does: .item() of an activation's statistic picks a Python branch (extra block or
# not), .tolist() of per-row norms picks rows by a Python list comprehension, .numpy() of the
# attention weights feeds a numpy histogram whose entropy (a numpy float) scales the loss, numpy
# views of activations are turned back into tensors by torch.as_tensor (a gating mask) and
# torch.from_numpy (soft targets built in numpy from a detached activation). Also an activation
# written through its numpy view (np.clip(out=)) after detach, and numpy views of two
# activations kept past backward and the optimizer step, read for logging afterwards.
# SGD with Nesterov. Four steps.
import numpy as np, torch, torch.nn as nn, torch.nn.functional as F
from common import setup, report
policy = setup()
torch.use_deterministic_algorithms(True)
B, T, D, H = 16, 64, 128, 4
class Model(nn.Module):
    def __init__(s):
        super().__init__()
        s.emb = nn.Linear(24, D); s.qkv = nn.Linear(D, 3 * D); s.o = nn.Linear(D, D)
        s.ff = nn.Sequential(nn.Linear(D, 4 * D), nn.GELU(), nn.Linear(4 * D, D))
        s.extra = nn.Sequential(nn.Linear(D, 4 * D), nn.Tanh(), nn.Linear(4 * D, D))
        s.ln1, s.ln2 = nn.LayerNorm(D), nn.LayerNorm(D); s.head = nn.Linear(D, 5)
        s.stats = {}
    def forward(s, x):
        h = s.emb(x)
        q, k, v = s.qkv(s.ln1(h)).view(B, T, 3, H, D // H).permute(2, 0, 3, 1, 4)
        att = (q @ k.transpose(-1, -2) / (D // H) ** 0.5).softmax(-1)
        a_np = att.detach().numpy()                            # a view of the activation
        s.stats["att_np"] = a_np; s.stats["h0_np"] = h.detach().numpy()   # kept for logging after the step
        hist, _ = np.histogram(a_np, bins=20, range=(0.0, float(a_np.max())))
        p = hist / hist.sum(); s.stats["att_entropy"] = float(-(p[p > 0] * np.log(p[p > 0])).sum())
        h = h + s.o((att @ v).transpose(1, 2).reshape(B, T, D))
        h = h + s.ff(s.ln2(h))
        if h.std().item() > 1.0:                                # branch on an activation's statistic
            h = h + 0.5 * s.extra(h); s.stats["branch"] = 1
        else:
            s.stats["branch"] = 0
        norms = h.detach().norm(dim=-1).mean(-1).tolist()       # python floats
        keep = [i for i, n in enumerate(norms) if n > sorted(norms)[B // 4]]
        gate_np = (h.detach().numpy().mean(-1) > np.median(h.detach().numpy())).astype(np.float32)
        gate = torch.as_tensor(gate_np).unsqueeze(-1)           # shares the numpy buffer
        h = h * (0.5 + gate)
        pooled = h.mean(1)
        return s.head(pooled), pooled, keep
model = Model()
opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, nesterov=True)
rng = np.random.default_rng(0)
losses = []
for step in range(4):
    x = torch.from_numpy(rng.standard_normal((B, T, 24)).astype(np.float32) * (1 + step))
    y = torch.from_numpy(rng.integers(0, 5, size=B))
    logits, pooled, keep = model(x)
    soft = pooled.detach().numpy()[:, :5].copy()
    soft = np.exp(soft - soft.max(1, keepdims=True)); soft /= soft.sum(1, keepdims=True)
    soft_t = torch.from_numpy(soft)
    idx = torch.tensor(keep, dtype=torch.long)
    loss = F.cross_entropy(logits[idx], y[idx]) * (1.0 + 0.1 * model.stats["att_entropy"])
    loss = loss + 0.1 * F.kl_div(F.log_softmax(logits, -1), soft_t, reduction="batchmean")
    opt.zero_grad(); loss.backward(); opt.step()
    with torch.no_grad():
        for p in model.head.parameters():
            np.clip(p.numpy(), -0.5, 0.5, out=p.numpy())       # in place through numpy
    # logging after the step from numpy views taken mid-forward (the tensors behind them were
    # saved for backward, then released by autograd; numpy holds them)
    att_max = torch.tensor(float(model.stats["att_np"].max(axis=-1).mean()))
    h0_sum = torch.tensor(float(np.abs(model.stats["h0_np"]).sum(dtype=np.float64)))
    acc = float((logits.argmax(-1).numpy() == y.numpy()).mean())
    losses += [loss.detach(), torch.tensor(acc), torch.tensor(model.stats["att_entropy"]),
               torch.tensor(float(model.stats["branch"])), torch.tensor(float(len(keep))), att_max, h0_sum]
report(policy, [model], losses)
