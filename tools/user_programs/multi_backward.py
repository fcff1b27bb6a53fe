# Untuned: multi-task sequence model with two backward passes over one graph. A 2-layer bidirectional
# nn.GRU (batch_first, dropout 0.1 between layers) encoder feeds a Conv1d per-timestep tagging head
# (loss1) and a pooled regression head (loss2); loss1.backward(retain_graph=True), then
# torch.autograd.grad(loss1, features, retain_graph=True) for a gradient-norm term logged only, then
# loss2.backward() on the same graph; opt.zero_grad(set_to_none=False) (zeroes .grad in place); Adagrad. 3 steps.
import torch, torch.nn as nn, torch.nn.functional as F
from common import setup, report
policy = setup()
torch.use_deterministic_algorithms(True)
B, T, IN, HID, TAGS = 32, 96, 64, 128, 12
class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.inp = nn.Linear(IN, HID)
        self.gru = nn.GRU(HID, HID, num_layers=2, dropout=0.1, bidirectional=True, batch_first=True)
        self.tagger = nn.Sequential(nn.Conv1d(2 * HID, 128, 3, padding=1), nn.ReLU(), nn.Conv1d(128, TAGS, 1))
        self.reg = nn.Sequential(nn.Linear(2 * HID, 64), nn.Tanh(), nn.Linear(64, 1))
    def forward(self, x):
        features, _ = self.gru(torch.relu(self.inp(x)))
        tags = self.tagger(features.transpose(1, 2))
        value = self.reg(features.mean(dim=1)).squeeze(-1)
        return features, tags, value
model = Net()
model.train()
opt = torch.optim.Adagrad(model.parameters(), lr=0.01)
g = torch.Generator().manual_seed(1)
losses = []
for step in range(3):
    x = torch.randn(B, T, IN, generator=g)
    y_tags = torch.randint(0, TAGS, (B, T), generator=g)
    y_val = torch.randn(B, generator=g)
    opt.zero_grad(set_to_none=False)
    features, tags, value = model(x)
    loss1 = F.cross_entropy(tags, y_tags)
    loss2 = F.mse_loss(value, y_val)
    loss1.backward(retain_graph=True)
    (gfeat,) = torch.autograd.grad(loss1, features, create_graph=False, retain_graph=True)
    reg = gfeat.norm()
    loss2.backward()
    opt.step()
    losses += [loss1.detach(), loss2.detach(), reg]
report(policy, [model], losses)
