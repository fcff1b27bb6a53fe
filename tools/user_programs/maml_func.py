# Untuned: second-order MAML (few-shot classification). A small conv net with BatchNorm (no running
# stats, as in the MAML paper) adapted per task by 2 functional SGD steps with torch.func.functional_call
# and torch.autograd.grad(create_graph=True) (gradients through gradients); 4 tasks per meta-batch,
# the query losses summed and backpropagated through the inner loops, outer Adam step. 3 steps.
import torch, torch.nn as nn, torch.nn.functional as F
from torch.func import functional_call
from common import setup, report
policy = setup()
torch.use_deterministic_algorithms(True)
N_WAY, K_SHOT, K_QUERY, TASKS, INNER, INNER_LR = 5, 5, 15, 4, 2, 0.1
def block(i, o): return nn.Sequential(nn.Conv2d(i, o, 3, padding=1), nn.BatchNorm2d(o, track_running_stats=False), nn.ReLU(), nn.MaxPool2d(2))
net = nn.Sequential(block(3, 32), block(32, 32), block(32, 32), nn.Flatten(), nn.Linear(32 * 4 * 4, N_WAY))
net.train()
meta_opt = torch.optim.Adam(net.parameters(), lr=1e-3)
g = torch.Generator().manual_seed(1)
def sample_task():
    protos = torch.randn(N_WAY, 3, 32, 32, generator=g)
    ys = torch.arange(N_WAY).repeat_interleave(K_SHOT)
    yq = torch.arange(N_WAY).repeat_interleave(K_QUERY)
    xs = protos[ys] + 0.5 * torch.randn(len(ys), 3, 32, 32, generator=g)
    xq = protos[yq] + 0.5 * torch.randn(len(yq), 3, 32, 32, generator=g)
    return xs, ys, xq, yq
losses = []
for step in range(3):
    meta_opt.zero_grad()
    params = dict(net.named_parameters())
    meta_loss = 0.0
    accs = []
    for t in range(TASKS):
        xs, ys, xq, yq = sample_task()
        fast = params
        for _ in range(INNER):
            loss = F.cross_entropy(functional_call(net, fast, (xs,)), ys)
            grads = torch.autograd.grad(loss, list(fast.values()), create_graph=True)
            fast = {k: w - INNER_LR * gr for (k, w), gr in zip(fast.items(), grads)}
        logits = functional_call(net, fast, (xq,))
        qloss = F.cross_entropy(logits, yq)
        meta_loss = meta_loss + qloss
        accs.append((logits.argmax(1) == yq).float().mean())
    meta_loss.backward()
    meta_opt.step()
    losses.append(meta_loss.detach())
    losses.append(torch.stack(accs).mean())
report(policy, [net], losses)
