# Untuned: adversarial training (Madry PGD inside a TRADES-style objective) of a small BatchNorm CNN on
# random 32x32 "images" in [0, 1]. For each batch: the model goes to eval mode, a 5-step L-inf PGD
# attack starts from x + uniform noise in [-eps, eps] (clamped to [0, 1]), and each step computes
# CE(model(x_adv), y), g, = torch.autograd.grad(loss, x_adv), x_adv = (x_adv + alpha * g.sign())
# .clamp(x - eps, x + eps).clamp(0, 1).detach() then .requires_grad_() again. Then train mode: clean
# logits and adversarial logits in one forward each, loss = CE(clean) + beta * KL(log_softmax(adv) ||
# softmax(clean)) (batchmean), SGD with momentum 0.9, nesterov, weight decay. 3 batches; the final
# adversarial examples' sum and the attack losses are reported too.
import torch, torch.nn as nn, torch.nn.functional as F
from common import setup, report
policy = setup()
torch.use_deterministic_algorithms(True)
B, C, R, EPS, ALPHA, STEPS, BETA = 32, 10, 32, 8 / 255, 2 / 255, 5, 6.0
def block(cin, cout, stride):
    return nn.Sequential(nn.Conv2d(cin, cout, 3, stride, 1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(inplace=True),
                         nn.Conv2d(cout, cout, 3, 1, 1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(inplace=True))
class Net(nn.Module):
    def __init__(s):
        super().__init__()
        s.features = nn.Sequential(block(3, 32, 1), block(32, 64, 2), block(64, 96, 2))
        s.pool = nn.AdaptiveAvgPool2d(1)
        s.fc = nn.Linear(96, C)
    def forward(s, x): return s.fc(torch.flatten(s.pool(s.features(x)), 1))
model = Net()
opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, nesterov=True, weight_decay=5e-4)
g = torch.Generator().manual_seed(1)
def pgd(model, x, y):
    model.eval()
    x_adv = (x + torch.empty_like(x).uniform_(-EPS, EPS, generator=g)).clamp(0, 1).detach()
    attack_losses = []
    for _ in range(STEPS):
        x_adv.requires_grad_()
        loss = F.cross_entropy(model(x_adv), y)
        grad, = torch.autograd.grad(loss, x_adv)
        x_adv = (x_adv + ALPHA * grad.sign()).clamp(x - EPS, x + EPS).clamp(0, 1).detach()
        attack_losses.append(loss.detach())
    model.train()
    return x_adv, attack_losses
losses = []
for step in range(3):
    x = torch.rand(B, 3, R, R, generator=g)
    y = torch.randint(0, C, (B,), generator=g)
    x_adv, al = pgd(model, x, y)
    losses += al
    logits = model(x)
    logits_adv = model(x_adv)
    loss_nat = F.cross_entropy(logits, y)
    loss_rob = F.kl_div(F.log_softmax(logits_adv, dim=1), F.softmax(logits, dim=1), reduction="batchmean")
    loss = loss_nat + BETA * loss_rob
    opt.zero_grad()
    loss.backward()
    opt.step()
    losses += [loss.detach(), loss_rob.detach(), (x_adv - x).abs().sum()]
report(policy, [model], losses)
