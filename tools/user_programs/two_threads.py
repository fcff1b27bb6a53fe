# Untuned: two Python threads, each training its own model (a CNN and an MLP) with its own
# optimizer and its own data generator (no global RNG in the models). Phase one: three steps
# where a thread per model is started and joined every step. Phase two: each thread runs its
# whole three-step loop concurrently with the other (MODE=lockstep or MODE=free: only one phase).
# Exceptions in a thread are re-raised in the main thread. Both models' losses and parameters are
# reported.
import os, threading, torch, torch.nn as nn, torch.nn.functional as F
from common import setup, report
policy = setup()
torch.use_deterministic_algorithms(True)
MODE = os.environ.get("MODE", "both")
cnn = nn.Sequential(nn.Conv2d(3, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(),
                    nn.Conv2d(32, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(),
                    nn.Conv2d(32, 64, 3, padding=1, stride=2), nn.BatchNorm2d(64), nn.ReLU(),
                    nn.Conv2d(64, 64, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, 10))
mlp = nn.Sequential(nn.Linear(128, 512), nn.LayerNorm(512), nn.GELU(), nn.Linear(512, 512), nn.GELU(),
                    nn.Linear(512, 512), nn.Tanh(), nn.Linear(512, 10))
jobs = {
    "cnn": dict(model=cnn, opt=torch.optim.SGD(cnn.parameters(), lr=0.05, momentum=0.9),
                g=torch.Generator().manual_seed(1), data=lambda g: (torch.randn(24, 3, 32, 32, generator=g), torch.randint(0, 10, (24,), generator=g)),
                losses=[]),
    "mlp": dict(model=mlp, opt=torch.optim.Adam(mlp.parameters(), lr=1e-3),
                g=torch.Generator().manual_seed(2), data=lambda g: (torch.randn(1024, 128, generator=g), torch.randint(0, 10, (1024,), generator=g)),
                losses=[]),
}
errors = []
def one_step(j):
    x, y = j["data"](j["g"])
    out = j["model"](x)
    loss = F.cross_entropy(out, y)
    j["opt"].zero_grad(); loss.backward(); j["opt"].step()
    j["losses"].append(loss.detach())
def run(j, n):
    try:
        for _ in range(n): one_step(j)
    except BaseException as e:
        errors.append(e)
def threads(n):
    ts = [threading.Thread(target=run, args=(j, n)) for j in jobs.values()]
    for t in ts: t.start()
    for t in ts: t.join()
    if errors: raise errors[0]
if MODE in ("both", "lockstep"):
    for step in range(3): threads(1)
if MODE in ("both", "free"):
    threads(3)
report(policy, [cnn, mlp], jobs["cnn"]["losses"] + jobs["mlp"]["losses"])
