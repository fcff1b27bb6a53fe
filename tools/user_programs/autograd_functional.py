# Untuned: curvature-regularised training with torch.autograd.functional inside the step. A
# contractive autoencoder on 28x28 "digits" (conv encoder to a 12-d code, ConvTranspose decoder
# with PixelShuffle upsampling): the contractive penalty is the Frobenius norm of the encoder's
# Jacobian at a few samples by autograd.functional.jacobian(create_graph=True, vectorize=True);
# a flatness penalty on a classifier head by Hutchinson's trace estimator with
# autograd.functional.hvp(create_graph=True) on the head's loss as a function of its (flattened)
# parameters; the exact hessian of a small Huber-loss calibration term in two temperature
# parameters by autograd.functional.hessian (its log-determinant logged); and a
# vector-Jacobian product by autograd.functional.vjp for a decoder smoothness term. Adadelta,
# ReduceLROnPlateau on the loss, 4 steps.
import torch, torch.nn as nn, torch.nn.functional as F
from torch.autograd import functional as AF
from torch.func import functional_call
from common import setup, report
policy = setup()
B, Z, NC = 48, 12, 10
class Enc(nn.Module):
    def __init__(s):
        super().__init__()
        s.net = nn.Sequential(nn.Conv2d(1, 32, 3, padding=1), nn.CELU(), nn.Conv2d(32, 64, 4, stride=2, padding=1), nn.CELU(),
                              nn.Conv2d(64, 64, 4, stride=2, padding=1), nn.CELU(), nn.Flatten(), nn.Linear(64 * 7 * 7, Z))
    def forward(s, x): return s.net(x)
class Dec(nn.Module):
    def __init__(s):
        super().__init__()
        s.fc = nn.Linear(Z, 64 * 7 * 7)
        s.net = nn.Sequential(nn.Conv2d(64, 128, 3, padding=1), nn.PixelShuffle(2), nn.Hardswish(),
                              nn.ConvTranspose2d(32, 32, 4, stride=2, padding=1), nn.Hardswish(), nn.Conv2d(32, 1, 3, padding=1))
    def forward(s, z): return s.net(s.fc(z).view(-1, 64, 7, 7))
enc, dec = Enc(), Dec()
head = nn.Sequential(nn.Linear(Z, 64), nn.Tanh(), nn.Linear(64, NC))
temps = nn.Parameter(torch.tensor([1.0, 0.5]))
params = list(enc.parameters()) + list(dec.parameters()) + list(head.parameters()) + [temps]
opt = torch.optim.Adadelta(params, lr=0.5)
sched = torch.optim.lr_scheduler.ReduceLROnPlateau(opt, factor=0.5, patience=0)
g = torch.Generator().manual_seed(1)
names = [n for n, _ in head.named_parameters()]
shapes = [p.shape for p in head.parameters()]
def unflat(v):
    out, i = {}, 0
    for n, sh in zip(names, shapes):
        k = sh.numel(); out[n] = v[i:i + k].view(sh); i += k
    return out
losses = []
for step in range(4):
    x = torch.rand(B, 1, 28, 28, generator=g)
    y = torch.randint(0, NC, (B,), generator=g)
    z = enc(x)
    rec = dec(z)
    recon = F.binary_cross_entropy_with_logits(rec, x)
    J = AF.jacobian(lambda xi: enc(xi), x[:2], create_graph=True, vectorize=True)   # (2, Z, 2, 1, 28, 28)
    contractive = J.pow(2).sum() / 2
    flat = torch.cat([p.reshape(-1) for p in head.parameters()])
    zd = z.detach()
    def head_loss(v): return F.cross_entropy(functional_call(head, unflat(v), (zd,)), y)
    probe = (torch.randint(0, 2, flat.shape, generator=g) * 2 - 1).float()
    hl, hv = AF.hvp(head_loss, flat, probe, create_graph=True)
    trace = (hv * probe).sum()
    logits = head(z)
    def calib(t): return F.huber_loss(torch.log_softmax(logits.detach() / t[0], -1).exp().max(-1).values * t[1], (logits.argmax(-1) == y).float())
    Hc = AF.hessian(calib, temps, create_graph=False)
    _, vj = AF.vjp(lambda zz: dec(zz), z[:4], torch.ones(4, 1, 28, 28), create_graph=True)
    smooth = vj.pow(2).mean()
    loss = recon + F.cross_entropy(logits, y) + 1e-3 * contractive + 1e-3 * trace.abs() + calib(temps) + 1e-3 * smooth
    opt.zero_grad()
    loss.backward()
    opt.step()
    sched.step(loss.item())
    losses += [loss.detach(), recon.detach(), contractive.detach(), trace.detach(), hl.detach(), torch.logdet(Hc + torch.eye(2)), smooth.detach()]
report(policy, [enc, dec, head], losses + [temps.detach()[0], temps.detach()[1]])
