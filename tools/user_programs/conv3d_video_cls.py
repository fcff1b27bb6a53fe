# Untuned: action classification on random 3x8x32x32 clips, model and input in
# torch.channels_last_3d memory format. A stem Conv3d(1x3x3) + BatchNorm3d + ReLU(inplace=True) and
# MaxPool3d(1x3x3, stride 1x2x2); R(2+1)D residual blocks, each 3-D conv factorised into a spatial
# Conv3d(1xkxk) and a temporal Conv3d(kx1x1) with BatchNorm3d and ReLU between; before the first
# conv of every block a TSM temporal shift: an eighth of the channels shifted forward in time by
# slicing and torch.cat with zeros, an eighth backward likewise, a third group by torch.roll along
# time (wrap-around), the rest unchanged; a strided block with a 1x1x1 Conv3d shortcut; a
# MaxPool3d(2x1x1) in time midway; AdaptiveAvgPool3d(1) and a Linear head with Dropout. SGD with
# momentum and nesterov, weight decay, a cosine LR schedule. Four steps; the clips' temporal
# order is reversed for half the batch (flip along dim 2) as augmentation.
import math, torch, torch.nn as nn, torch.nn.functional as F
from common import setup, report
policy = setup()
torch.use_deterministic_algorithms(True)
B, T, S, NC = 8, 8, 32, 12
CL = torch.channels_last_3d
def temporal_shift(x, fold_div=8):
    n, c, t, h, w = x.shape
    f = c // fold_div
    fwd = torch.cat([torch.zeros_like(x[:, :f, :1]), x[:, :f, :-1]], dim=2)          # shift forward
    bwd = torch.cat([x[:, f:2 * f, 1:], torch.zeros_like(x[:, f:2 * f, :1])], dim=2)  # shift backward
    rol = torch.roll(x[:, 2 * f:3 * f], shifts=1, dims=2)                             # cyclic
    return torch.cat([fwd, bwd, rol, x[:, 3 * f:]], dim=1)
class Conv2Plus1D(nn.Sequential):
    def __init__(s, cin, cout, mid, stride=1):
        super().__init__(
            nn.Conv3d(cin, mid, (1, 3, 3), (1, stride, stride), (0, 1, 1), bias=False),
            nn.BatchNorm3d(mid), nn.ReLU(inplace=True),
            nn.Conv3d(mid, cout, (3, 1, 1), (stride, 1, 1), (1, 0, 0), bias=False))
class Block(nn.Module):
    def __init__(s, cin, cout, stride=1):
        super().__init__()
        mid = (cin * cout * 27) // (cin * 9 + 3 * cout)          # R(2+1)D's parameter-matched width
        s.conv1 = Conv2Plus1D(cin, cout, mid, stride); s.bn1 = nn.BatchNorm3d(cout)
        s.conv2 = Conv2Plus1D(cout, cout, mid); s.bn2 = nn.BatchNorm3d(cout)
        s.relu = nn.ReLU(inplace=True)
        s.down = None
        if stride != 1 or cin != cout:
            s.down = nn.Sequential(nn.Conv3d(cin, cout, 1, stride, bias=False), nn.BatchNorm3d(cout))
    def forward(s, x):
        idt = x if s.down is None else s.down(x)
        h = s.relu(s.bn1(s.conv1(temporal_shift(x))))
        h = s.bn2(s.conv2(h))
        return s.relu(h + idt)
class R2Plus1D(nn.Module):
    def __init__(s):
        super().__init__()
        s.stem = nn.Sequential(nn.Conv3d(3, 32, (1, 3, 3), padding=(0, 1, 1), bias=False), nn.BatchNorm3d(32),
                               nn.ReLU(inplace=True), nn.MaxPool3d((1, 3, 3), (1, 2, 2), (0, 1, 1)))
        s.layer1 = nn.Sequential(Block(32, 32), Block(32, 32))
        s.tpool = nn.MaxPool3d((2, 1, 1), (2, 1, 1))
        s.layer2 = nn.Sequential(Block(32, 64, stride=2), Block(64, 64))
        s.pool = nn.AdaptiveAvgPool3d(1)
        s.fc = nn.Sequential(nn.Dropout(0.3), nn.Linear(64, NC))
    def forward(s, x):
        x = s.layer1(s.stem(x))
        x = s.layer2(s.tpool(x))
        return s.fc(torch.flatten(s.pool(x), 1))
model = R2Plus1D().to(memory_format=CL)
opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, nesterov=True, weight_decay=1e-4)
sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=4)
g = torch.Generator().manual_seed(1)
losses = []
for step in range(4):
    clip = torch.randn(B, 3, T, S, S, generator=g)
    y = torch.randint(0, NC, (B,), generator=g)
    rev = torch.rand(B, generator=g) < 0.5
    clip = torch.where(rev[:, None, None, None, None], clip.flip(2), clip)
    clip = clip.contiguous(memory_format=CL)
    out = model(clip)
    loss = F.cross_entropy(out, y)
    opt.zero_grad(); loss.backward(); opt.step(); sched.step()
    losses += [loss.detach(), (out.argmax(1) == y).float().mean()]
report(policy, [model], losses)
