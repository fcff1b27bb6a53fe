# Untuned: a student CNN distilled from a teacher whose outputs come from torch.inference_mode()
# and are .clone()d (outside inference mode) into targets; an evaluation under inference_mode and
# another under no_grad between training steps; a cache of no_grad features (computed by the
# student's own trunk at the end of a step) reused in the next step's loss as a feature-consistency
# term; an inference tensor kept from eval and read (as a plain input) by the next step's loss.
# Adam. Five steps.
import torch, torch.nn as nn, torch.nn.functional as F
from common import setup, report
policy = setup()
torch.use_deterministic_algorithms(True)
def trunk(w):
    return nn.Sequential(nn.Conv2d(3, w, 3, padding=1), nn.GroupNorm(8, w), nn.GELU(),
                         nn.Conv2d(w, w, 3, padding=1), nn.GroupNorm(8, w), nn.GELU(),
                         nn.Conv2d(w, 2 * w, 3, padding=1, stride=2), nn.GroupNorm(8, 2 * w), nn.GELU(),
                         nn.Conv2d(2 * w, 2 * w, 3, padding=1), nn.GELU())
class Net(nn.Module):
    def __init__(s, w):
        super().__init__(); s.trunk = trunk(w); s.head = nn.Linear(2 * w, 10); s.proj = nn.Linear(2 * w, 32)
    def forward(s, x):
        f = s.trunk(x).mean((2, 3))
        return s.head(f), s.proj(f)
teacher, student = Net(48), Net(32)
for p in teacher.parameters(): p.requires_grad_(False)
teacher.eval()
opt = torch.optim.Adam(student.parameters(), lr=2e-3)
g = torch.Generator().manual_seed(1)
X = torch.randn(5, 32, 3, 32, 32, generator=g); Y = torch.randint(0, 10, (5, 32), generator=g)
Xv = torch.randn(16, 3, 32, 32, generator=g)
losses, cache, kept = [], None, None
for step in range(5):
    x, y = X[step], Y[step]
    with torch.inference_mode():
        t_logits, t_feat = teacher(x)
        t_prob = F.softmax(t_logits / 2.0, -1)
    t_prob = t_prob.clone(); t_feat = t_feat.clone()   # usable by autograd now
    logits, feat = student(x)
    loss = F.cross_entropy(logits, y) + 4.0 * F.kl_div(F.log_softmax(logits / 2.0, -1), t_prob, reduction="batchmean")
    loss = loss + 0.1 * F.mse_loss(feat, t_feat)
    if cache is not None:
        loss = loss + 0.05 * F.mse_loss(feat, cache)
    if kept is not None:
        loss = loss + 0.01 * (logits.mean(0) - kept.clone()).pow(2).sum()
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    losses.append(loss.detach())
    with torch.no_grad():
        _, cache = student(x)            # next step's consistency target
    student.eval()
    with torch.inference_mode():
        vl, _ = student(Xv)
        kept = vl.mean(0)                # an inference tensor kept across the step
        losses.append(vl.float().pow(2).mean().clone())
    with torch.no_grad():
        vl2, vf2 = student(Xv)
        losses.append((vl2 - vl).abs().max()); losses.append(vf2.sum())
    student.train()
report(policy, [student, teacher], losses)
