# Untuned: a __torch_function__ tensor subclass for bookkeeping, as users write one to track where
# activations came from. TaggedTensor (input.as_subclass) carries a set of tags and an op count;
# __torch_function__ runs the op through super() (so results come back as TaggedTensors), then
# merges the tags of every TaggedTensor argument into every TaggedTensor result (through lists,
# tuples and torch.return_types). Inputs are tagged by augmentation ("flip", "noise"); a small CNN
# (Conv2d, BatchNorm2d, ReLU(inplace=True), MaxPool2d, a residual add, channel attention by sigmoid
# gating, dropout, flatten) sees them as TaggedTensors; two branches' features are torch.cat-ed and
# split; the loss weights samples by a tag read in Python and asserts the tags reached the logits.
# Tags are also attached to a tensor between forward and backward (a detached tensor's attribute),
# and one branch unwraps with .as_subclass(torch.Tensor). SGD momentum, 4 steps.
import torch, torch.nn as nn, torch.nn.functional as F
from common import setup, report
policy = setup()
torch.use_deterministic_algorithms(True)

class TaggedTensor(torch.Tensor):
    @staticmethod
    def tag(t, *tags):
        t = t.as_subclass(TaggedTensor)
        t.tags = set(tags); t.nops = 0
        return t
    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = super().__torch_function__(func, types, args, kwargs)
        if func in (torch.Tensor.__repr__, torch.Tensor.__format__) or func.__name__ in ("__get__", "__set__"):
            return out
        tags, nops = set(), 0
        def collect(x):
            nonlocal nops
            if isinstance(x, TaggedTensor):
                tags.update(getattr(x, "tags", ())); nops = max(nops, getattr(x, "nops", 0))
            elif isinstance(x, (list, tuple)):
                for y in x: collect(y)
        collect(args); collect(list(kwargs.values()))
        def stamp(x):
            if isinstance(x, TaggedTensor):
                if not hasattr(x, "tags"): x.tags = set()
                x.tags |= tags; x.nops = nops + 1
            elif isinstance(x, (list, tuple)):
                for y in x: stamp(y)
        stamp(out)
        return out

class ChannelGate(nn.Module):
    def __init__(s, c, r=4):
        super().__init__(); s.fc1 = nn.Linear(c, c // r); s.fc2 = nn.Linear(c // r, c)
    def forward(s, x):
        w = torch.sigmoid(s.fc2(F.relu(s.fc1(x.mean((2, 3))))))
        return x * w[:, :, None, None]
class ResBlock(nn.Module):
    def __init__(s, c):
        super().__init__()
        s.c1 = nn.Conv2d(c, c, 3, padding=1, bias=False); s.b1 = nn.BatchNorm2d(c)
        s.c2 = nn.Conv2d(c, c, 3, padding=1, bias=False); s.b2 = nn.BatchNorm2d(c)
        s.gate = ChannelGate(c); s.act = nn.ReLU(inplace=True)
    def forward(s, x):
        h = s.act(s.b1(s.c1(x)))
        h = s.gate(s.b2(s.c2(h)))
        return s.act(h + x)
class Net(nn.Module):
    def __init__(s):
        super().__init__()
        s.stem = nn.Sequential(nn.Conv2d(3, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(inplace=True))
        s.a = nn.Sequential(ResBlock(32), ResBlock(32), nn.MaxPool2d(2))
        s.b = nn.Sequential(nn.Conv2d(32, 32, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2))
        s.mix = nn.Sequential(ResBlock(64), nn.MaxPool2d(2), ResBlock(64))
        s.head = nn.Sequential(nn.Flatten(), nn.Dropout(0.2), nn.Linear(64 * 16 * 16, 10))
    def forward(s, x):
        h = s.stem(x)
        ya = s.a(h)
        yb = s.b(h.as_subclass(torch.Tensor))   # this branch leaves the bookkeeping
        y = torch.cat([ya, yb], 1)
        y = s.mix(y)
        y1, y2 = y.split(32, 1)
        y = torch.cat([y1 * 0.5, y2], 1)
        return s.head(y)

model = Net()
opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, weight_decay=1e-4)
g = torch.Generator().manual_seed(1)
losses = []
for step in range(4):
    x = torch.randn(48, 3, 64, 64, generator=g)
    y = torch.randint(0, 10, (48,), generator=g)
    half = x.shape[0] // 2
    xa = TaggedTensor.tag(x[:half].flip(-1), "flip", f"step{step}")
    xb = TaggedTensor.tag(x[half:] + 0.1 * torch.randn(x[half:].shape, generator=g), "noise", f"step{step}")
    inp = torch.cat([xa, xb])
    assert isinstance(inp, TaggedTensor) and {"flip", "noise"} <= inp.tags
    logits = model(inp)
    assert isinstance(logits, TaggedTensor) and f"step{step}" in logits.tags, (type(logits), getattr(logits, "tags", None))
    per = F.cross_entropy(logits, y, reduction="none")
    w = torch.ones(per.shape[0])
    if "noise" in per.tags: w[half:] = 0.5
    loss = (per * w).sum() / w.sum()
    marker = loss.detach().as_subclass(TaggedTensor); marker.tags = {"logged"}
    opt.zero_grad()
    loss.backward()
    opt.step()
    losses.append(loss.detach().as_subclass(torch.Tensor))
report(policy, [model], losses)
