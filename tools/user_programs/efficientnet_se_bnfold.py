# Untuned: an EfficientNet-B0-style classifier on random 3x48x48 images with every BatchNorm built
# with momentum=None (a cumulative moving average of the batch statistics, weighted by
# num_batches_tracked). MBConv blocks: 1x1 expansion, depthwise conv, squeeze-excitation (pool,
# reduce conv, SiLU, expand conv, sigmoid, x * gate), 1x1 projection; stochastic depth written as
# torchvision's stochastic_depth(mode="row") (a per-sample noise tensor bernoulli_ then div_ in
# place, input * noise). Five AdamW steps. After the second step: model.eval(), a validation pass
# under no_grad, then a deepcopy of the model whose Conv2d/BatchNorm2d pairs are folded by
# torch.nn.utils.fusion.fuse_conv_bn_eval (BN replaced by Identity) and evaluated without no_grad (the
# user forgot it), the fused/unfused difference logged; then model.train(). The fourth step trains
# with the BatchNorm layers put back in eval() (frozen statistics, still learning their affine).
import copy, torch, torch.nn as nn, torch.nn.functional as F
from torch.nn.utils.fusion import fuse_conv_bn_eval
from common import setup, report
policy = setup()
torch.use_deterministic_algorithms(True)
B, NC = 16, 10
def bn(c): return nn.BatchNorm2d(c, momentum=None)
class ConvBNAct(nn.Sequential):
    def __init__(s, cin, cout, k, stride=1, groups=1, act=True):
        super().__init__(nn.Conv2d(cin, cout, k, stride, k // 2, groups=groups, bias=False), bn(cout),
                         nn.SiLU() if act else nn.Identity())
class SqueezeExcite(nn.Module):
    def __init__(s, c, r):
        super().__init__(); s.fc1 = nn.Conv2d(c, r, 1); s.fc2 = nn.Conv2d(r, c, 1)
    def forward(s, x):
        w = F.adaptive_avg_pool2d(x, 1)
        w = torch.sigmoid(s.fc2(F.silu(s.fc1(w))))
        return x * w
def stochastic_depth(x, p, training):
    if not training or p == 0.0: return x
    survival = 1.0 - p
    noise = torch.empty([x.shape[0]] + [1] * (x.ndim - 1), dtype=x.dtype, device=x.device)
    noise = noise.bernoulli_(survival)
    noise.div_(survival)
    return x * noise
class MBConv(nn.Module):
    def __init__(s, cin, cout, expand, k, stride, sd):
        super().__init__()
        mid = cin * expand
        layers = [ConvBNAct(cin, mid, 1)] if expand != 1 else []
        layers += [ConvBNAct(mid, mid, k, stride, groups=mid), SqueezeExcite(mid, max(1, cin // 4)),
                   ConvBNAct(mid, cout, 1, act=False)]
        s.block = nn.Sequential(*layers)
        s.use_res = stride == 1 and cin == cout
        s.sd = sd
    def forward(s, x):
        h = s.block(x)
        if s.use_res:
            h = stochastic_depth(h, s.sd, s.training)
            h = h + x
        return h
class EffNet(nn.Module):
    cfg = [(1, 16, 3, 1, 1), (6, 24, 3, 2, 2), (6, 40, 5, 2, 2), (6, 80, 3, 2, 2), (6, 112, 5, 1, 1)]
    def __init__(s):
        super().__init__()
        s.stem = ConvBNAct(3, 32, 3, 2)
        blocks, cin, n_total, i = [], 32, sum(c[4] for c in s.cfg), 0
        for e, c, k, st, n in s.cfg:
            for j in range(n):
                blocks.append(MBConv(cin, c, e, k, st if j == 0 else 1, 0.2 * i / n_total)); cin = c; i += 1
        s.blocks = nn.Sequential(*blocks)
        s.head = ConvBNAct(cin, 320, 1)
        s.drop = nn.Dropout(0.2); s.fc = nn.Linear(320, NC)
    def forward(s, x):
        x = s.head(s.blocks(s.stem(x)))
        return s.fc(s.drop(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1)))
def fuse_model(m):
    m = copy.deepcopy(m)
    for mod in m.modules():
        if isinstance(mod, ConvBNAct):
            mod[0] = fuse_conv_bn_eval(mod[0], mod[1]); mod[1] = nn.Identity()
    return m
model = EffNet()
opt = torch.optim.AdamW(model.parameters(), lr=2e-3, weight_decay=0.05)
g = torch.Generator().manual_seed(1)
xval = torch.randn(32, 3, 48, 48, generator=g); yval = torch.randint(0, NC, (32,), generator=g)
losses = []
for step in range(5):
    x = torch.randn(B, 3, 48, 48, generator=g); y = torch.randint(0, NC, (B,), generator=g)
    if step == 3:
        for m in model.modules():
            if isinstance(m, nn.BatchNorm2d): m.eval()
    loss = F.cross_entropy(model(x), y, label_smoothing=0.1)
    opt.zero_grad(); loss.backward(); opt.step()
    losses.append(loss.detach())
    model.train()
    if step == 1:
        model.eval()
        with torch.no_grad():
            out = model(xval)
            losses.append(F.cross_entropy(out, yval))
        fused = fuse_model(model)
        fout = fused(xval)
        losses += [F.cross_entropy(fout, yval).item(), (fout - out).abs().max().item(),
                   (fout.argmax(1) == yval).float().mean().item()]
        del fused, fout
        model.train()
report(policy, [model], losses)
