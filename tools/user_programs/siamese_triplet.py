# Untuned: conv embedding net with shared weights applied to anchor/positive/negative (three forward
# calls per step), F.normalize, TripletMarginLoss + in-batch cosine-similarity cross-entropy, RMSprop, 3 steps.
import torch, torch.nn as nn, torch.nn.functional as F
from common import setup, report
policy = setup()
class EmbedNet(nn.Module):
    def __init__(s, dim=64):
        super().__init__()
        def blk(i, o): return nn.Sequential(nn.Conv2d(i, o, 3, padding=1), nn.BatchNorm2d(o), nn.ReLU(inplace=True),
                                            nn.Conv2d(o, o, 3, padding=1), nn.BatchNorm2d(o), nn.ReLU(inplace=True), nn.MaxPool2d(2))
        s.features = nn.Sequential(blk(3, 32), blk(32, 64), blk(64, 128))
        s.fc = nn.Linear(128, dim)
    def forward(s, x):
        x = s.features(x)
        x = F.adaptive_avg_pool2d(x, 1).flatten(1)
        return F.normalize(s.fc(x), dim=1)
model = EmbedNet()
model.train()
opt = torch.optim.RMSprop(model.parameters(), lr=1e-3, momentum=0.9)
crit = nn.TripletMarginLoss(margin=0.2)
temperature = 0.1
B = 32
g = torch.Generator().manual_seed(1)
losses = []
for step in range(3):
    anchor = torch.randn(B, 3, 48, 48, generator=g)
    positive = anchor + 0.1 * torch.randn(B, 3, 48, 48, generator=g)
    negative = torch.randn(B, 3, 48, 48, generator=g)
    a, p, n = model(anchor), model(positive), model(negative)
    sim = a @ p.T / temperature
    loss = crit(a, p, n) + F.cross_entropy(sim, torch.arange(B))
    opt.zero_grad()
    loss.backward()
    opt.step()
    losses.append(loss.detach())
report(policy, [model], losses)
