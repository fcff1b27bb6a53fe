# Untuned: the usual input pipeline. A map-style Dataset that builds each sample in __getitem__
# (a synthetic image, then random crop/flip/noise augmentation from a per-index torch.Generator),
# a DataLoader with num_workers=2, persistent_workers=True and a custom collate_fn (default fork
# start method: the workers fork with pyalloc installed), a small CNN trained on it with SGD.
# A second, spawn-context loader (multiprocessing_context="spawn") feeds a validation pass under
# no_grad each epoch. CTX=spawn: the training loader spawns too (SPAWN=0: no validation workers).
# Two epochs of 3 batches each; the loss of every batch is reported.
import os, torch, torch.nn as nn, torch.nn.functional as F
from torch.utils.data import Dataset, DataLoader
from common import setup, report

class Synth(Dataset):
    def __init__(self, n, seed):
        self.n, self.seed = n, seed
    def __len__(self):
        return self.n
    def __getitem__(self, i):
        g = torch.Generator().manual_seed(self.seed * 1000 + i)
        img = torch.randn(3, 40, 40, generator=g)
        img = img + torch.linspace(-1, 1, 40).view(1, 1, 40) * (i % 3)
        dx, dy = torch.randint(0, 9, (2,), generator=g).tolist()
        img = img[:, dy:dy + 32, dx:dx + 32]
        if torch.rand(1, generator=g).item() < 0.5:
            img = img.flip(-1)
        img = img + 0.05 * torch.randn(img.shape, generator=g)
        label = int(i % 10)
        return {"image": img.contiguous(), "label": label, "idx": i}

def collate(batch):
    imgs = torch.stack([b["image"] for b in batch])
    labels = torch.tensor([b["label"] for b in batch], dtype=torch.long)
    idx = torch.tensor([b["idx"] for b in batch])
    return imgs, labels, idx

class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.f = nn.Sequential(
            nn.Conv2d(3, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(),
            nn.Conv2d(32, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(),
            nn.Conv2d(32, 64, 3, padding=1, stride=2), nn.BatchNorm2d(64), nn.ReLU(),
            nn.Conv2d(64, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU(),
            nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, 10))
    def forward(self, x):
        return self.f(x)

if __name__ == "__main__":
    policy = setup()
    torch.use_deterministic_algorithms(True)
    ctx = {"multiprocessing_context": os.environ["CTX"]} if os.environ.get("CTX") else {}  # CTX=spawn: no fork
    train = DataLoader(Synth(96, 1), batch_size=32, shuffle=True, num_workers=2, persistent_workers=True,
                       collate_fn=collate, generator=torch.Generator().manual_seed(3), **ctx)
    spawn = os.environ.get("SPAWN", "1") == "1"
    val = DataLoader(Synth(32, 2), batch_size=16, num_workers=2 if spawn else 0, collate_fn=collate,
                     **({"multiprocessing_context": "spawn", "persistent_workers": True} if spawn else {}))
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    losses = []
    for epoch in range(2):
        model.train()
        for x, y, idx in train:
            opt.zero_grad()
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            losses.append(loss.detach()); losses.append(idx.sum().float())
        model.eval()
        with torch.no_grad():
            vl = sum(F.cross_entropy(model(x), y, reduction="sum") for x, y, _ in val)
        losses.append(vl)
    report(policy, [model], losses)
