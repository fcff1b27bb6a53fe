# Untuned: single-image super-resolution (ESPCN/EDSR style, x4) on random 3x64x64 "images" whose
# low-resolution inputs come from F.interpolate(mode="bicubic", antialias=True) of the target. A
# head conv on F.pad(x, (1,1,1,1), mode="reflect") (the convs take padding_mode="reflect"), residual
# blocks scaled by 0.1 without BatchNorm (PReLU), a global skip, two upsampling stages of conv to 4C
# then F.pixel_shuffle(2), and the bicubic upsample of the input added to the output (a learned
# residual). The loss: L1 on pixels plus a perceptual loss through a frozen feature net (a VGG-like
# conv stack, requires_grad_(False), eval) on both output and target (the target's features under
# no_grad), features taken at two depths with forward hooks writing into a dict, MSE on them; a
# total-variation term by differences of shifted slices. Adam with MultiStepLR, 3 steps, PSNR of the
# clamped output logged; finally an eval pass on a 48x48 crop through F.pixel_unshuffle and back.
import math, torch, torch.nn as nn, torch.nn.functional as F
from common import setup, report
policy = setup()
torch.use_deterministic_algorithms(True)
B, HR, C, NRES = 8, 64, 48, 6
class ResBlock(nn.Module):
    def __init__(s):
        super().__init__()
        s.c1 = nn.Conv2d(C, C, 3, padding=1, padding_mode="reflect"); s.act = nn.PReLU(C)
        s.c2 = nn.Conv2d(C, C, 3, padding=1, padding_mode="reflect")
    def forward(s, x): return x + 0.1 * s.c2(s.act(s.c1(x)))
class SR(nn.Module):
    def __init__(s):
        super().__init__()
        s.head = nn.Conv2d(3, C, 3)
        s.body = nn.Sequential(*[ResBlock() for _ in range(NRES)], nn.Conv2d(C, C, 3, padding=1))
        s.up = nn.ModuleList(nn.Conv2d(C, 4 * C, 3, padding=1) for _ in range(2))
        s.tail = nn.Conv2d(C, 3, 3, padding=1)
    def forward(s, x):
        h = s.head(F.pad(x, (1, 1, 1, 1), mode="reflect"))
        h = h + s.body(h)
        for u in s.up: h = F.relu(F.pixel_shuffle(u(h), 2))
        return s.tail(h) + F.interpolate(x, scale_factor=4, mode="bicubic", align_corners=False)
feat = nn.Sequential(nn.Conv2d(3, 32, 3, padding=1), nn.ReLU(), nn.Conv2d(32, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                     nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.Conv2d(64, 64, 3, padding=1), nn.ReLU()).eval().requires_grad_(False)
acts = {}
feat[3].register_forward_hook(lambda m, i, o: acts.__setitem__("relu1", o))
feat[8].register_forward_hook(lambda m, i, o: acts.__setitem__("relu2", o))
MEAN, STD = torch.tensor([0.485, 0.456, 0.406]).view(1, 3, 1, 1), torch.tensor([0.229, 0.224, 0.225]).view(1, 3, 1, 1)
def perceptual(sr, hr):
    with torch.no_grad():
        feat((hr - MEAN) / STD); t1, t2 = acts["relu1"], acts["relu2"]
    feat((sr - MEAN) / STD)
    return F.mse_loss(acts["relu1"], t1) + F.mse_loss(acts["relu2"], t2)
def tv(x): return (x[..., 1:, :] - x[..., :-1, :]).abs().mean() + (x[..., :, 1:] - x[..., :, :-1]).abs().mean()
model = SR()
opt = torch.optim.Adam(model.parameters(), lr=1e-4, betas=(0.9, 0.999))
sched = torch.optim.lr_scheduler.MultiStepLR(opt, milestones=[2], gamma=0.5)
g = torch.Generator().manual_seed(1)
losses = []
for step in range(3):
    hr = torch.sigmoid(F.interpolate(torch.randn(B, 3, 16, 16, generator=g) * 2, size=HR, mode="bilinear", align_corners=False))
    lr = F.interpolate(hr, scale_factor=0.25, mode="bicubic", align_corners=False, antialias=True)
    sr = model(lr)
    loss = F.l1_loss(sr, hr) + 0.1 * perceptual(sr, hr) + 1e-3 * tv(sr)
    opt.zero_grad()
    loss.backward()
    opt.step()
    sched.step()
    with torch.no_grad(): psnr = 10 * torch.log10(1 / F.mse_loss(sr.clamp(0, 1), hr))
    losses += [loss.detach(), psnr]
model.eval()
with torch.no_grad():
    crop = F.pixel_shuffle(F.pixel_unshuffle(lr[:2, :, :12, :12], 2), 2)
    losses.append(model(crop).sum())
report(policy, [model], losses)
