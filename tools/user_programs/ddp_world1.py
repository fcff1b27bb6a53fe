# Untuned: DistributedDataParallel launched the way users do, in a single process (world_size=1,
# gloo, tcp:// init on a free port): a small conv net wrapped in DDP (GABV=1:
# gradient_as_bucket_view=True, so .grad are views into DDP's flat buckets), gradient accumulation
# over two micro-batches with model.no_sync() on the first, SGD with momentum, 3 steps; the
# process group is destroyed after report().
import os, socket, torch, torch.nn as nn, torch.nn.functional as F
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from common import setup, report
policy = setup()

def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0)); return s.getsockname()[1]
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)

class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(inplace=True),
            nn.Conv2d(32, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(inplace=True), nn.MaxPool2d(2),
            nn.Conv2d(32, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU(inplace=True),
            nn.Conv2d(64, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU(inplace=True), nn.MaxPool2d(2))
        self.classifier = nn.Sequential(nn.Flatten(), nn.Dropout(0.2), nn.Linear(64 * 8 * 8, 10))
    def forward(self, x):
        return self.classifier(self.features(x))

model = Net()
ddp_model = DDP(model, gradient_as_bucket_view=os.environ.get("GABV") == "1")
opt = torch.optim.SGD(ddp_model.parameters(), lr=0.01, momentum=0.9)
accum = 2
g = torch.Generator().manual_seed(1)
losses = []
for step in range(3):
    opt.zero_grad()
    total = 0.0
    for micro in range(accum):
        x = torch.randn(32, 3, 32, 32, generator=g)
        y = torch.randint(0, 10, (32,), generator=g)
        if micro < accum - 1:
            with ddp_model.no_sync():
                loss = F.cross_entropy(ddp_model(x), y) / accum
                loss.backward()
        else:
            loss = F.cross_entropy(ddp_model(x), y) / accum
            loss.backward()
        total += loss.detach()
    opt.step()
    losses.append(total)
report(policy, [model], losses)
dist.destroy_process_group()
