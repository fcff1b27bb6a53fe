# Untuned: small ResNet-style CNN (BatchNorm, residual adds, in-place ReLU) in channels_last memory format,
# forward under CPU autocast bfloat16, SGD nesterov, OneCycleLR, label smoothing.
import torch, torch.nn as nn, torch.nn.functional as F
from common import setup, report
policy = setup()
torch.use_deterministic_algorithms(True)
class BasicBlock(nn.Module):
    def __init__(s, cin, cout, stride=1):
        super().__init__()
        s.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False); s.bn1 = nn.BatchNorm2d(cout)
        s.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False); s.bn2 = nn.BatchNorm2d(cout)
        s.relu = nn.ReLU(inplace=True)
        s.down = None
        if stride != 1 or cin != cout:
            s.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))
    def forward(s, x):
        identity = x
        out = s.relu(s.bn1(s.conv1(x)))
        out = s.bn2(s.conv2(out))
        if s.down is not None: identity = s.down(x)
        out += identity
        return s.relu(out)
class ResNet(nn.Module):
    def __init__(s, nc=10):
        super().__init__()
        s.stem = nn.Sequential(nn.Conv2d(3, 32, 3, 1, 1, bias=False), nn.BatchNorm2d(32), nn.ReLU(inplace=True))
        s.layers = nn.Sequential(BasicBlock(32, 32), BasicBlock(32, 32), BasicBlock(32, 64, 2), BasicBlock(64, 64),
                                 BasicBlock(64, 128, 2), BasicBlock(128, 128))
        s.pool = nn.AdaptiveAvgPool2d(1); s.fc = nn.Linear(128, nc)
    def forward(s, x): return s.fc(torch.flatten(s.pool(s.layers(s.stem(x))), 1))
model = ResNet().to(memory_format=torch.channels_last)
opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, nesterov=True, weight_decay=5e-4)
sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=0.1, total_steps=3)
crit = nn.CrossEntropyLoss(label_smoothing=0.1)
g = torch.Generator().manual_seed(1)
B = 32
losses = []
for step in range(3):
    x = torch.randn(B, 3, 32, 32, generator=g).to(memory_format=torch.channels_last)
    y = torch.randint(0, 10, (B,), generator=g)
    opt.zero_grad(set_to_none=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = model(x)
        loss = crit(out, y)
    loss.backward()
    opt.step(); sched.step()
    losses.append(loss.detach())
report(policy, [model], losses)
