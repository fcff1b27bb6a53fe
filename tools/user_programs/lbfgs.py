# Untuned: a small MLP regression trained with torch.optim.LBFGS (history 10, max_iter 5, strong Wolfe line
# search). The closure runs forward+backward several times per opt.step().
import torch, torch.nn as nn, torch.nn.functional as F
from common import setup, report
policy = setup()
torch.use_deterministic_algorithms(True)
N, DIN, H = 4096, 32, 256
g = torch.Generator().manual_seed(1)
X = torch.randn(N, DIN, generator=g)
w_true = torch.randn(DIN, 1, generator=g)
y = torch.sin(X @ w_true) + 0.1 * torch.randn(N, 1, generator=g)
model = nn.Sequential(nn.Linear(DIN, H), nn.Tanh(), nn.Linear(H, H), nn.Tanh(),
                      nn.Linear(H, H), nn.GELU(), nn.Linear(H, H), nn.Tanh(), nn.Linear(H, 1))
opt = torch.optim.LBFGS(model.parameters(), lr=1, history_size=10, max_iter=5, line_search_fn="strong_wolfe")
losses = []
def closure():
    opt.zero_grad()
    loss = F.mse_loss(model(X), y)
    loss.backward()
    return loss
for step in range(3):
    loss = opt.step(closure)
    losses.append(loss.detach())
    with torch.no_grad(): losses.append(F.mse_loss(model(X), y))
report(policy, [model], losses)
