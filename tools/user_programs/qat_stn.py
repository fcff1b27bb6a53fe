# Untuned: small CNN with QAT (prepare_qat, fbgemm qconfig: FakeQuantize modules whose observers
# update buffers in forward) behind a spatial transformer (affine_grid + grid_sample from a
# localization net); classifier head under CPU bf16 autocast; Adam.
import torch, torch.nn as nn, torch.nn.functional as F
import torch.ao.quantization as tq
from common import setup, report
policy = setup()
torch.use_deterministic_algorithms(True)
B, NCLS = 64, 10
class STN(nn.Module):
    def __init__(s):
        super().__init__()
        s.loc = nn.Sequential(nn.Conv2d(3, 16, 7), nn.MaxPool2d(2), nn.ReLU(True), nn.Conv2d(16, 16, 5), nn.MaxPool2d(2), nn.ReLU(True))
        s.fc = nn.Sequential(nn.Linear(16 * 4 * 4, 32), nn.ReLU(True), nn.Linear(32, 6))
        s.fc[2].weight.data.zero_(); s.fc[2].bias.data.copy_(torch.tensor([1, 0, 0, 0, 1, 0], dtype=torch.float))
    def forward(s, x):
        xs = F.adaptive_avg_pool2d(s.loc(x), 4)
        theta = s.fc(xs.flatten(1)).view(-1, 2, 3)
        grid = F.affine_grid(theta, x.size(), align_corners=False)
        return F.grid_sample(x, grid, align_corners=False)
class QFeatures(nn.Module):
    def __init__(s):
        super().__init__()
        s.quant = tq.QuantStub(); s.dequant = tq.DeQuantStub()
        s.b = nn.Sequential(nn.Conv2d(3, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(),
                            nn.Conv2d(32, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
                            nn.Conv2d(32, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU(),
                            nn.Conv2d(64, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(2))
    def forward(s, x): return s.dequant(s.b(s.quant(x)))
class Net(nn.Module):
    def __init__(s):
        super().__init__(); s.stn = STN(); s.feat = QFeatures()
        s.head = nn.Sequential(nn.Flatten(), nn.Linear(64 * 8 * 8, 128), nn.ReLU(), nn.Dropout(0.3), nn.Linear(128, NCLS))
    def forward(s, x):
        x = s.feat(s.stn(x))
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = s.head(x)
        return out.float()
model = Net()
model.train()
model.feat.qconfig = tq.get_default_qat_qconfig("fbgemm")
tq.fuse_modules_qat(model.feat.b, [["0", "1", "2"], ["3", "4", "5"], ["7", "8", "9"], ["10", "11", "12"]], inplace=True)
tq.prepare_qat(model.feat, inplace=True)
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
g = torch.Generator().manual_seed(1)
xs = torch.randn(3, B, 3, 32, 32, generator=g); ys = torch.randint(0, NCLS, (3, B), generator=g)
losses = []
for step in range(3):
    opt.zero_grad()
    loss = F.cross_entropy(model(xs[step]), ys[step])
    loss.backward()
    opt.step()
    losses.append(loss.detach())
report(policy, [model], losses)
