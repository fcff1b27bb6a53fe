# Untuned: parametrizations and norms that keep state, trained SAM-style with
# torch.func.functional_call. A token MLP-mixer: new-style spectral_norm (power iteration writes
# _u/_v buffers in place in every training forward, n_power_iterations=2) on a layer called twice
# per forward (weight shared across two depths, outside parametrize.cached(), so the buffers move
# between the calls), old-style torch.nn.utils.spectral_norm (forward pre-hook, weight_u) and
# torch.nn.utils.weight_norm (hook-based) on others, new-style weight_norm on the channel mixer, a
# custom register_parametrization (a learnable-scale Symmetric map with right_inverse) used twice
# under parametrize.cached(). Each step: loss and grads at the weights, then a SAM perturbation
# e = rho * g / ||g|| and a second forward through functional_call(model, {name: p + e}) (dict of
# replacement params; buffers keep being updated), backward to the originals, SGD+momentum.
# The power-iteration buffers are logged with .sum().item() between forward and backward. 4 steps.
import torch, torch.nn as nn, torch.nn.functional as F
from torch.nn.utils import parametrize
from torch.nn.utils.parametrizations import spectral_norm, weight_norm
from torch.func import functional_call
from common import setup, report
policy = setup()
torch.use_deterministic_algorithms(True)
B, T, D, C = 32, 64, 256, 10
class Sym(nn.Module):
    def __init__(s): super().__init__(); s.scale = nn.Parameter(torch.ones(()))
    def forward(s, X): return s.scale * (X.triu() + X.triu(1).transpose(-1, -2))
    def right_inverse(s, X): return X.triu()
class Mixer(nn.Module):
    def __init__(s):
        super().__init__()
        s.inp = nn.Linear(32, D)
        s.tok = spectral_norm(nn.Linear(T, T), n_power_iterations=2)      # shared across depths
        s.ch = weight_norm(nn.Linear(D, 2 * D))
        s.ch2 = torch.nn.utils.spectral_norm(nn.Linear(2 * D, D))            # old-style, hook
        s.ln1 = nn.LayerNorm(D); s.ln2 = nn.LayerNorm(D); s.ln3 = nn.LayerNorm(D)
        s.sq = nn.Linear(D, D)
        parametrize.register_parametrization(s.sq, "weight", Sym())
        s.wn = torch.nn.utils.weight_norm(nn.Linear(D, D))                   # old-style, hook
        s.head = nn.Linear(D, C)
    def forward(s, x):
        h = F.gelu(s.inp(x))
        for ln in (s.ln1, s.ln2):   # token mixing with the same spectrally normalised weight twice
            h = h + s.tok(ln(h).transpose(1, 2)).transpose(1, 2)
            h = h + s.ch2(F.gelu(s.ch(h)))
        with parametrize.cached():
            h = h + torch.tanh(s.sq(s.ln3(h)))
            h = h + torch.tanh(s.sq(h))
        h = F.silu(s.wn(h))
        return s.head(h.mean(1))
model = Mixer()
opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
g = torch.Generator().manual_seed(1)
losses, rho = [], 0.05
for step in range(4):
    x = torch.randn(B, T, 32, generator=g); y = torch.randint(0, C, (B,), generator=g)
    loss = F.cross_entropy(model(x), y)
    losses += [loss.detach(), torch.tensor(model.tok.parametrizations.weight[0]._u.sum().item()),
               torch.tensor(model.ch2.weight_u.sum().item())]
    opt.zero_grad()
    loss.backward()
    params = dict(model.named_parameters())
    with torch.no_grad():
        gn = torch.norm(torch.stack([p.grad.norm() for p in params.values() if p.grad is not None]))
    pert = {n: p + (rho * p.grad / (gn + 1e-12)).detach() if p.grad is not None else p for n, p in params.items()}
    opt.zero_grad()
    loss2 = F.cross_entropy(functional_call(model, pert, (x,)), y)
    loss2.backward()
    opt.step()
    losses += [loss2.detach(), gn]
    for n, b in model.named_buffers(): losses.append(b.detach().double().sum())
report(policy, [model], losses)
