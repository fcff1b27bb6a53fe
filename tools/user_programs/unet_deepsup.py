# Untuned: a segmentation U-Net with deep supervision. Model and inputs in channels_last memory
# format; encoder blocks Conv-GroupNorm-ReLU(inplace=True) x2, MaxPool2d between; the two deepest
# encoder blocks run under torch.utils.checkpoint(use_reentrant=False); decoder upsamples with
# ConvTranspose2d, concatenates the skip, and has a 1x1 auxiliary head at each scale whose logits
# are F.interpolate'd (bilinear, align_corners=False) to full resolution for auxiliary
# cross-entropy losses, plus a soft Dice term on the main output (softmax, one_hot permuted to
# NCHW); main loss (CE + Dice) weighted 1, auxiliaries 0.5 and 0.25. SGD with Nesterov momentum, a OneCycleLR schedule
# stepped every iteration, 3 steps.
import torch, torch.nn as nn, torch.nn.functional as F
from torch.utils.checkpoint import checkpoint
from common import setup, report
policy = setup()
torch.use_deterministic_algorithms(True)
B, CIN, NCLS, S, W = 6, 3, 5, 128, 16
def block(i, o):
    return nn.Sequential(nn.Conv2d(i, o, 3, padding=1, bias=False), nn.GroupNorm(8, o), nn.ReLU(inplace=True),
                         nn.Conv2d(o, o, 3, padding=1, bias=False), nn.GroupNorm(8, o), nn.ReLU(inplace=True))
class UNet(nn.Module):
    def __init__(s):
        super().__init__()
        ch = [W, 2 * W, 4 * W, 8 * W]
        s.enc = nn.ModuleList([block(CIN, ch[0]), block(ch[0], ch[1]), block(ch[1], ch[2]), block(ch[2], ch[3])])
        s.pool = nn.MaxPool2d(2)
        s.up = nn.ModuleList([nn.ConvTranspose2d(ch[i + 1], ch[i], 2, stride=2) for i in range(3)])
        s.dec = nn.ModuleList([block(2 * ch[i], ch[i]) for i in range(3)])
        s.heads = nn.ModuleList([nn.Conv2d(ch[i], NCLS, 1) for i in range(3)])
    def forward(s, x):
        skips = []
        for i, e in enumerate(s.enc):
            if i > 0: x = s.pool(x)
            x = checkpoint(e, x, use_reentrant=False) if i >= 2 else e(x)
            skips.append(x)
        outs = []
        for i in (2, 1, 0):
            x = s.dec[i](torch.cat([s.up[i](x), skips[i]], 1))
            outs.append(s.heads[i](x))
        return outs[::-1]                    # full resolution first
model = UNet().to(memory_format=torch.channels_last)
opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, nesterov=True, weight_decay=1e-4)
sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=0.05, total_steps=3)
g = torch.Generator().manual_seed(1)
def dice_loss(logits, y):
    p = logits.softmax(1)
    oh = F.one_hot(y, NCLS).permute(0, 3, 1, 2).float()
    inter = (p * oh).sum((0, 2, 3)); den = p.sum((0, 2, 3)) + oh.sum((0, 2, 3))
    return 1 - ((2 * inter + 1) / (den + 1)).mean()
losses = []
for step in range(3):
    x = torch.randn(B, CIN, S, S, generator=g).contiguous(memory_format=torch.channels_last)
    y = (x[:, 0] > 0.5).long() + (x[:, 1] > 0.5).long() * 2 + (x[:, 2] > 1.5).long()
    outs = model(x)
    main = outs[0]
    loss = F.cross_entropy(main, y) + dice_loss(main, y)
    for w, o in zip((0.5, 0.25), outs[1:]):
        up = F.interpolate(o, size=(S, S), mode="bilinear", align_corners=False)
        loss = loss + w * F.cross_entropy(up, y)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step(); sched.step()
    losses += [loss.detach(), main.detach().argmax(1).eq(y).float().mean()]
model.eval()
with torch.no_grad(): losses.append(model(x)[0].square().sum())
report(policy, [model], losses)
