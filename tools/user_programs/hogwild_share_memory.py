# Untuned: Hogwild! as the PyTorch mnist_hogwild example writes it. model.share_memory() moves the
# parameters into shared memory, then torch.multiprocessing workers (fork start method, so each
# child inherits pyalloc) each build their own SGD optimizer and train the shared parameters in
# place; the parent waits for them and trains on. To keep the bits comparable the workers run one
# after another (start, join), and each writes its losses into a shared log tensor. The parent
# evaluates a validation batch under no_grad before the workers run and again after, and reports
# the change (the "before" logits are held across the workers' writes to the shared weights). An
# MLP with LayerNorm and dropout; the parent trains 2 steps with Adam, then 2 workers x 3 steps,
# then 3 more parent steps.
import torch, torch.nn as nn, torch.nn.functional as F
import torch.multiprocessing as mp
from common import setup, report
B, D, NC, STEPS = 2048, 256, 10, 3
class Net(nn.Module):
    def __init__(s):
        super().__init__()
        s.inp = nn.Linear(64, D)
        s.layers = nn.ModuleList([nn.Sequential(nn.LayerNorm(D), nn.Linear(D, 2 * D), nn.GELU(), nn.Dropout(0.1), nn.Linear(2 * D, D)) for _ in range(4)])
        s.head = nn.Linear(D, NC)
    def forward(s, x):
        h = s.inp(x)
        for l in s.layers: h = h + l(h)
        return s.head(h)
def batch(g):
    x = torch.randn(B, 64, generator=g)
    return x, (x[:, :NC] * 2 + torch.randn(B, NC, generator=g)).argmax(1)
def worker(rank, model, log):
    torch.manual_seed(100 + rank)
    g = torch.Generator().manual_seed(10 + rank)
    opt = torch.optim.SGD(model.parameters(), lr=0.02, momentum=0.5)
    model.train()
    for step in range(STEPS):
        x, y = batch(g)
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad(); loss.backward(); opt.step()
        log[rank * STEPS + step] = loss.detach()
if __name__ == "__main__":
    policy = setup()
    torch.use_deterministic_algorithms(True)
    model = Net()
    model.share_memory()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(1)
    xv, yv = batch(torch.Generator().manual_seed(99))
    losses = []
    def parent_step():
        x, y = batch(g)
        logits = model(x)
        loss = F.cross_entropy(logits, y)
        opt.zero_grad(); loss.backward(); opt.step()
        losses.append(loss.detach())
        return logits
    for step in range(2): logits = parent_step()
    model.eval()
    with torch.no_grad(): before = model(xv)
    model.train()
    log = torch.zeros(2 * STEPS).share_memory_()
    ctx = mp.get_context("fork")
    for rank in range(2):
        p = ctx.Process(target=worker, args=(rank, model, log))
        p.start(); p.join()
        assert p.exitcode == 0, p.exitcode
    losses += list(log)
    model.eval()
    with torch.no_grad(): after = model(xv)
    model.train()
    for step in range(3): logits = parent_step()
    losses += [F.cross_entropy(before, yv), F.cross_entropy(after, yv), (before.argmax(1) != after.argmax(1)).sum().float(),
               (logits.argmax(1) == 0).sum().float()]
    report(policy, [model], losses)
