# Untuned: domain-adversarial training (DANN). CNN feature extractor with BatchNorm, label
# classifier on source features, domain classifier behind a gradient reversal layer; a tensor
# hook halves the feature gradients; two optimizers stepped every iteration; 3 steps.
import math, torch, torch.nn as nn, torch.nn.functional as F
from common import setup, report
policy = setup()
torch.use_deterministic_algorithms(True)
B, H = 24, 32
class GradReverse(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, lam):
        ctx.lam = lam
        return x.view_as(x)
    @staticmethod
    def backward(ctx, g):
        return -ctx.lam * g, None
def block(i, o): return nn.Sequential(nn.Conv2d(i, o, 3, padding=1), nn.BatchNorm2d(o), nn.ReLU(), nn.Conv2d(o, o, 3, padding=1), nn.BatchNorm2d(o), nn.ReLU(), nn.MaxPool2d(2))
feat_net = nn.Sequential(block(3, 32), block(32, 64), block(64, 64), nn.Flatten())  # -> 64*4*4
cls_net = nn.Sequential(nn.Linear(1024, 256), nn.ReLU(), nn.Dropout(0.3), nn.Linear(256, 10))
dom_net = nn.Sequential(nn.Linear(1024, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 1))
opt_main = torch.optim.SGD(list(feat_net.parameters()) + list(cls_net.parameters()), lr=0.01, momentum=0.9, weight_decay=5e-4)
opt_dom = torch.optim.Adam(dom_net.parameters(), lr=1e-3)
g = torch.Generator().manual_seed(1)
xs = torch.randn(3, B, 3, H, H, generator=g); ys = torch.randint(0, 10, (3, B), generator=g)
xt = torch.randn(3, B, 3, H, H, generator=g) * 1.3 + 0.2
losses = []
steps = 3
for step in range(steps):
    p = step / steps; lam = 2.0 / (1.0 + math.exp(-10 * p)) - 1.0
    opt_main.zero_grad(); opt_dom.zero_grad()
    x = torch.cat([xs[step], xt[step]], 0)
    feat = feat_net(x)
    feat.register_hook(lambda gr: gr * 0.5)
    f_src, f_tgt = torch.split(feat, B, 0)
    cls_loss = F.cross_entropy(cls_net(f_src), ys[step])
    dom_logits = dom_net(GradReverse.apply(feat, lam)).squeeze(1)
    dom_lab = torch.cat([torch.zeros(B), torch.ones(B)])
    dom_loss = F.binary_cross_entropy_with_logits(dom_logits, dom_lab)
    ent = -(F.softmax(cls_net[3](cls_net[1](cls_net[0](f_tgt))), 1) * F.log_softmax(cls_net[3](cls_net[1](cls_net[0](f_tgt))), 1)).sum(1).mean()
    loss = cls_loss + dom_loss + 0.1 * ent
    loss.backward()
    gn = torch.sqrt(sum(p.grad.pow(2).sum() for p in feat_net.parameters()))
    opt_main.step(); opt_dom.step()
    losses += [cls_loss.detach(), dom_loss.detach(), ent.detach(), gn.detach()]
    losses += [feat_net[0][1].running_mean.sum(), feat_net[2][4].running_var.sum()]
feat_net.eval(); cls_net.eval()
with torch.no_grad(): losses.append(cls_net(feat_net(xt[0])).sum())
losses.append(opt_main.state[next(feat_net.parameters())]["momentum_buffer"].sum())
report(policy, [feat_net, cls_net, dom_net], losses)
