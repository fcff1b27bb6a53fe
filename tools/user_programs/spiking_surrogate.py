# Untuned: a spiking MLP (leaky integrate-and-fire neurons, as in snntorch's tutorials) on random 28x28
# "images" rate-coded into spikes by torch.rand(x.shape) < x (the global generator) at each of 25
# timesteps. Spikes come from a custom autograd.Function: forward a heaviside of mem - threshold,
# backward the fast-sigmoid surrogate 1 / (slope * |u| + 1)^2 of the saved membrane potential. Layer 1
# has a learnable decay (sigmoid of a parameter) and resets by subtraction in place
# (mem1.sub_(spk1 * threshold)); layer 2 resets to zero on a clone (mem2 = mem2.clone();
# mem2[spk2.bool()] = 0); the output layer never resets. Output spikes are written into a preallocated
# (T, B, C) buffer by index assignment (spk_rec[t] = spk3) and membranes into a list stacked at the end.
# Loss: cross entropy on the spike counts plus a firing-rate regulariser on layer 1 and a small
# membrane MSE on the output layer. fc2 and fc3 start with weights scaled up (x3, x6) so they fire. Adam, 3 steps; spike counts reported.
import torch, torch.nn as nn, torch.nn.functional as F
from common import setup, report
policy = setup()
torch.use_deterministic_algorithms(True)
T, B, NIN, H1, H2, C, THR, SLOPE = 25, 64, 784, 512, 256, 10, 1.0, 25.0
class FastSigmoidSpike(torch.autograd.Function):
    @staticmethod
    def forward(ctx, u):
        ctx.save_for_backward(u)
        return (u > 0).float()
    @staticmethod
    def backward(ctx, grad_out):
        u, = ctx.saved_tensors
        return grad_out / (SLOPE * u.abs() + 1.0) ** 2
spike = FastSigmoidSpike.apply
class SNN(nn.Module):
    def __init__(s):
        super().__init__()
        s.fc1, s.fc2, s.fc3 = nn.Linear(NIN, H1), nn.Linear(H1, H2), nn.Linear(H2, C)
        s.beta1 = nn.Parameter(torch.full((H1,), 2.0))
        s.beta2, s.beta3 = 0.9, 0.8
        with torch.no_grad(): s.fc2.weight.mul_(3); s.fc3.weight.mul_(6)
    def forward(s, x):
        b = x.shape[0]
        mem1 = torch.zeros(b, H1); mem2 = torch.zeros(b, H2); mem3 = torch.zeros(b, C)
        spk_rec = torch.zeros(T, b, C)
        mem_rec, rate1 = [], 0
        beta1 = torch.sigmoid(s.beta1)
        for t in range(T):
            inp = (torch.rand(x.shape) < x).float()
            mem1 = beta1 * mem1 + s.fc1(inp)
            spk1 = spike(mem1 - THR)
            mem1.sub_(spk1 * THR)
            mem2 = s.beta2 * mem2 + s.fc2(spk1)
            spk2 = spike(mem2 - THR)
            mem2 = mem2.clone()
            mem2[spk2.bool()] = 0
            mem3 = s.beta3 * mem3 + s.fc3(spk2)
            spk3 = spike(mem3 - THR)
            spk_rec[t] = spk3
            mem_rec.append(mem3)
            rate1 = rate1 + spk1.mean()
        return spk_rec, torch.stack(mem_rec), rate1 / T
model = SNN()
opt = torch.optim.Adam(model.parameters(), lr=5e-4)
g = torch.Generator().manual_seed(1)
losses = []
for step in range(3):
    x = torch.rand(B, NIN, generator=g)
    y = torch.randint(0, C, (B,), generator=g)
    spk_rec, mem_rec, rate1 = model(x)
    counts = spk_rec.sum(0)
    loss = F.cross_entropy(counts, y) + 0.1 * (rate1 - 0.1) ** 2
    loss = loss + 1e-3 * F.mse_loss(mem_rec, F.one_hot(y, C).float().expand(T, -1, -1) * THR)
    opt.zero_grad()
    loss.backward()
    opt.step()
    losses += [loss.detach(), counts.detach().sum(), rate1.detach(), (counts.argmax(1) == y).float().mean()]
report(policy, [model], losses)
