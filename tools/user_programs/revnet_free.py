# Untuned: a reversible network that saves memory by hand, the way memcnn/revlib/RevTorch do. Each
# reversible block is a custom torch.autograd.Function whose forward computes y1 = x1 + F(x2),
# y2 = x2 + G(y1) under torch.no_grad, frees its inputs' memory with x.untyped_storage().resize_(0)
# (the previous block's outputs, which that block keeps as detached aliases on ctx rather than by
# save_for_backward), and keeps only detached aliases of its outputs. backward reconstructs the
# inputs from the outputs (x2 = y2 - G(y1), x1 = y1 - F(x2)), re-runs F and G under enable_grad on
# detached leaves, gets parameter and input gradients with torch.autograd.backward (parameters'
# .grad accumulated there), and restores the freed storages (resize_ back, copy_ the reconstructed
# values) so the block below finds its outputs again. F and G are GroupNorm-ReLU-conv; 6 blocks on
# channel halves split by chunk + contiguous after a conv stem, an ordinary conv/pool/linear head.
# SGD with momentum and weight decay, 3 steps.
import torch, torch.nn as nn, torch.nn.functional as F
from common import setup, report
policy = setup()
torch.use_deterministic_algorithms(True)
B, Cin, R, Ch, C, NB = 16, 3, 32, 32, 10, 6
def free(t): t.untyped_storage().resize_(0)
def restore(t, value):
    t.untyped_storage().resize_(value.numel() * value.element_size())
    with torch.no_grad(): t.copy_(value)
class RevFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x1, x2, Fm, Gm):
        ctx.Fm, ctx.Gm = Fm, Gm
        with torch.no_grad():
            y1 = x1 + Fm(x2)
            y2 = x2 + Gm(y1)
        ctx.x = (x1.detach(), x2.detach())
        free(x1); free(x2)
        ctx.y = (y1.detach(), y2.detach())
        return y1, y2
    @staticmethod
    def backward(ctx, dy1, dy2):
        y1, y2 = ctx.y
        with torch.enable_grad():
            y1_ = y1.detach().requires_grad_()
            g = ctx.Gm(y1_)
            torch.autograd.backward(g, dy2)
        with torch.no_grad():
            x2 = y2 - g
        with torch.enable_grad():
            x2_ = x2.detach().requires_grad_()
            f = ctx.Fm(x2_)
            dy1_tot = dy1 + y1_.grad
            torch.autograd.backward(f, dy1_tot)
        with torch.no_grad():
            x1 = y1 - f
            dx2 = dy2 + x2_.grad
        restore(ctx.x[0], x1); restore(ctx.x[1], x2)
        del ctx.x, ctx.y
        return dy1_tot, dx2, None, None
def branch():
    return nn.Sequential(nn.GroupNorm(4, Ch), nn.ReLU(), nn.Conv2d(Ch, Ch, 3, padding=1), nn.GroupNorm(4, Ch), nn.ReLU(), nn.Conv2d(Ch, Ch, 3, padding=1))
class RevNet(nn.Module):
    def __init__(s):
        super().__init__()
        s.stem = nn.Sequential(nn.Conv2d(Cin, 2 * Ch, 3, padding=1), nn.BatchNorm2d(2 * Ch))
        s.Fs = nn.ModuleList([branch() for _ in range(NB)]); s.Gs = nn.ModuleList([branch() for _ in range(NB)])
        s.head = nn.Sequential(nn.ReLU(), nn.Conv2d(2 * Ch, 64, 3, stride=2, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(2), nn.Flatten(), nn.Linear(256, C))
    def forward(s, x):
        h = s.stem(x)
        x1, x2 = (t.contiguous() for t in h.chunk(2, 1))
        for Fm, Gm in zip(s.Fs, s.Gs):
            x1, x2 = RevFn.apply(x1, x2, Fm, Gm)
        return s.head(torch.cat([x1, x2], 1))
model = RevNet()
opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=5e-4)
g = torch.Generator().manual_seed(1)
losses = []
for step in range(3):
    x = torch.randn(B, Cin, R, R, generator=g); y = torch.randint(0, C, (B,), generator=g)
    logits = model(x)
    loss = F.cross_entropy(logits, y)
    opt.zero_grad()
    loss.backward()
    gn = torch.nn.utils.clip_grad_norm_(model.parameters(), 10.0)
    opt.step()
    losses += [loss.detach(), gn, logits.detach().square().sum()]
report(policy, [model], losses)
