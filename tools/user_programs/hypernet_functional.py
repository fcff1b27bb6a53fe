# Untuned: a hypernetwork for multi-task regression/classification. A task embedding goes
# through a hypernetwork MLP whose heads emit the full weights of a target conv net (two 3x3
# convs and a linear classifier) for that task; the generated tensors are activations (large,
# reused by every sample of the task's batch) and are applied with torch.func.functional_call on
# a template module whose own parameters are never trained. The generated conv kernels go
# through a weight-norm style reparametrisation (direction normalised per output channel times a
# generated gain), and an L2 regulariser plus a decorrelation penalty on the generated weights is
# added to the loss. Four tasks per step, Adam, 5 steps.
import torch, torch.nn as nn, torch.nn.functional as F
from torch.func import functional_call
from common import setup, report
policy = setup()

class Target(nn.Module):
    def __init__(self, c1=32, c2=48, n=10):
        super().__init__()
        self.conv1 = nn.Conv2d(3, c1, 3, padding=1)
        self.conv2 = nn.Conv2d(c1, c2, 3, padding=1)
        self.fc = nn.Linear(c2, n)
    def forward(self, x):
        x = F.relu(self.conv1(x))
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.fc(x.mean((2, 3)))

class HyperNet(nn.Module):
    def __init__(self, target, n_tasks, emb=64, hidden=128):
        super().__init__()
        self.shapes = {k: v.shape for k, v in target.named_parameters()}
        self.task_emb = nn.Embedding(n_tasks, emb)
        self.trunk = nn.Sequential(nn.Linear(emb, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU())
        self.heads = nn.ModuleDict({k.replace(".", "_"): nn.Linear(hidden, s.numel()) for k, s in self.shapes.items()})
        self.gains = nn.ModuleDict({k.replace(".", "_"): nn.Linear(hidden, s[0])
                                    for k, s in self.shapes.items() if k.endswith("weight") and len(s) == 4})
        for h in self.heads.values():
            nn.init.normal_(h.weight, std=0.01)
    def forward(self, task):
        z = self.trunk(self.task_emb(task))
        params = {}
        for k, s in self.shapes.items():
            key = k.replace(".", "_")
            w = self.heads[key](z).view(s)
            if key in self.gains:  # weight norm: w = g * v / ||v|| per output channel
                g = F.softplus(self.gains[key](z)) + 0.5
                v_norm = w.flatten(1).norm(dim=1).clamp_min(1e-6)
                w = w * (g / v_norm).view(-1, *([1] * (w.dim() - 1)))
            params[k] = w
        return params

def weight_reg(params):
    reg = sum(p.pow(2).mean() for p in params.values())
    w = params["conv2.weight"].flatten(1)
    gram = F.normalize(w, dim=1) @ F.normalize(w, dim=1).t()
    return reg + (gram - torch.eye(gram.size(0))).pow(2).mean()

N_TASKS = 8
target = Target()
target.requires_grad_(False)
hyper = HyperNet(target, N_TASKS)
opt = torch.optim.Adam(hyper.parameters(), lr=3e-4)
g = torch.Generator().manual_seed(1)
protos = torch.randn(N_TASKS, 10, 3, 1, 1, generator=g)
losses = []
for step in range(5):
    tasks = torch.randperm(N_TASKS, generator=g)[:4]
    opt.zero_grad()
    total = 0.0
    outs = []
    for t in tasks:
        y = torch.randint(0, 10, (64,), generator=g)
        x = torch.randn(64, 3, 32, 32, generator=g) + protos[t, y]
        params = hyper(t.view(1).squeeze(0))
        logits = functional_call(target, params, (x,))
        loss = F.cross_entropy(logits, y) + 1e-3 * weight_reg(params)
        outs.append(loss)
        total = total + loss
    (total / len(tasks)).backward()
    torch.nn.utils.clip_grad_norm_(hyper.parameters(), 5.0)
    opt.step()
    losses += [total.detach()] + [o.detach() for o in outs]
report(policy, [hyper, target], losses)
