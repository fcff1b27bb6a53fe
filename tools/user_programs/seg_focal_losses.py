# Untuned: semantic segmentation with the losses people pile up for imbalanced classes. A small
# encoder-decoder on 3 x 64 x 64 images: strided convolutions with GroupNorm and SiLU down to 1/4,
# a decoder that goes up once by ConvTranspose2d and once by a conv + PixelShuffle(2), skips
# resized by F.interpolate(mode="bilinear", align_corners=True) and concatenated, and a deep
# supervision head at 1/4 upsampled bilinearly (align_corners=False) to full size. Labels are
# 64 x 64 class maps (6 classes, drawn from a smoothed random field) with an ignore band of 255
# along random borders. Loss: F.nll_loss on log_softmax with class weights and ignore_index=255;
# a focal loss written by hand (gather of log-probabilities at the clamped labels, (1 - p)^2
# modulation, the ignored pixels masked out); a soft Dice loss on softmax against F.one_hot of
# the labels, ignored pixels zeroed by a mask; the aux head's cross_entropy with the same
# ignore_index. Adam(fused=True) (supported on the CPU in torch 2.13), three steps.
import torch, torch.nn as nn, torch.nn.functional as F
from common import setup, report
policy = setup()
torch.use_deterministic_algorithms(True)
B, C, NC, S, IGN = 16, 32, 6, 64, 255
def cgs(i, o, stride=1):
    return nn.Sequential(nn.Conv2d(i, o, 3, stride, 1), nn.GroupNorm(8, o), nn.SiLU())
class SegNet(nn.Module):
    def __init__(s):
        super().__init__()
        s.e1 = nn.Sequential(cgs(3, C), cgs(C, C))                # 64
        s.e2 = nn.Sequential(cgs(C, 2 * C, 2), cgs(2 * C, 2 * C))  # 32
        s.e3 = nn.Sequential(cgs(2 * C, 4 * C, 2), cgs(4 * C, 4 * C))  # 16
        s.up1 = nn.ConvTranspose2d(4 * C, 2 * C, 4, 2, 1)         # 16 -> 32
        s.d1 = cgs(4 * C, 2 * C)
        s.up2 = nn.Sequential(nn.Conv2d(2 * C, 4 * C, 3, 1, 1), nn.PixelShuffle(2))   # 32 -> 64, C ch
        s.d2 = cgs(2 * C + C, C)
        s.out = nn.Conv2d(C, NC, 1)
        s.aux = nn.Conv2d(4 * C, NC, 1)
    def forward(s, x):
        f1 = s.e1(x); f2 = s.e2(f1); f3 = s.e3(f2)
        u = s.up1(f3)
        u = s.d1(torch.cat([u, F.interpolate(f2, size=u.shape[-2:], mode="bilinear", align_corners=True)], 1))
        u = s.up2(u)
        skip = F.interpolate(f3, scale_factor=4, mode="bilinear", align_corners=True)[:, : 2 * C]
        u = s.d2(torch.cat([u, skip + F.interpolate(f2, scale_factor=2, mode="bilinear", align_corners=True)], 1))
        aux = F.interpolate(s.aux(f3), size=x.shape[-2:], mode="bilinear", align_corners=False)
        return s.out(u), aux
def focal_loss(logits, y, gamma=2.0):
    logp = F.log_softmax(logits, 1)
    valid = y != IGN
    yc = torch.where(valid, y, torch.zeros_like(y))
    lp = logp.gather(1, yc[:, None]).squeeze(1)
    fl = -((1 - lp.exp()) ** gamma) * lp
    return (fl * valid).sum() / valid.sum().clamp(min=1)
def dice_loss(logits, y, eps=1.0):
    p = logits.softmax(1)
    valid = (y != IGN)
    oh = F.one_hot(torch.where(valid, y, torch.zeros_like(y)), NC).permute(0, 3, 1, 2).float()
    m = valid[:, None].float()
    inter = (p * oh * m).sum((0, 2, 3))
    den = (p * m).sum((0, 2, 3)) + (oh * m).sum((0, 2, 3))
    return 1 - ((2 * inter + eps) / (den + eps)).mean()
net = SegNet()
opt = torch.optim.Adam(net.parameters(), lr=2e-3, fused=True)
cls_w = torch.tensor([0.3, 1.0, 1.0, 2.0, 2.0, 4.0])
g = torch.Generator().manual_seed(1)
losses = []
for step in range(3):
    x = torch.randn(B, 3, S, S, generator=g)
    field = F.avg_pool2d(torch.randn(B, NC, S, S, generator=g), 9, 1, 4) + 0.3 * x[:, :1]
    y = field.argmax(1)
    edge = torch.randint(2, 8, (B,), generator=g)
    idx = torch.arange(S)
    band = (idx[None, :, None] < edge[:, None, None]) | (idx[None, None, :] >= S - edge[:, None, None])
    y = y.masked_fill(band, IGN)
    logits, aux = net(x)
    nll = F.nll_loss(F.log_softmax(logits, 1), y, weight=cls_w, ignore_index=IGN)
    loss = nll + focal_loss(logits, y) + dice_loss(logits, y) + 0.4 * F.cross_entropy(aux, y, ignore_index=IGN)
    opt.zero_grad(); loss.backward(); opt.step()
    losses += [loss.detach(), nll.detach()]
report(policy, [net], losses)
