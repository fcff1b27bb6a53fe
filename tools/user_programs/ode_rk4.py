# Untuned: latent neural ODE on point clouds, hand-written fixed-step RK4 (12 steps, the MLP
# dynamics called 48 times per forward, time concatenated as a feature), trajectory loss on
# torch.stack of the states plus a Chamfer term via torch.cdist; Adam, 3 steps.
import torch, torch.nn as nn, torch.nn.functional as F
from common import setup, report
policy = setup()
torch.use_deterministic_algorithms(True)
B, P, Q, D, HID, NSTEP = 4, 128, 96, 64, 256, 12
class Dyn(nn.Module):
    def __init__(s):
        super().__init__(); s.l1 = nn.Linear(D + 1, HID); s.l2 = nn.Linear(HID, HID); s.l3 = nn.Linear(HID, D)
        s.nfe = 0
    def forward(s, t, y):
        s.nfe += 1
        tt = t.expand(*y.shape[:-1], 1)
        h = torch.tanh(s.l1(torch.cat([y, tt], -1)))
        h = F.softplus(s.l2(h))
        return s.l3(h)
def rk4(f, y0, t0, t1, n):
    dt = (t1 - t0) / n; ys = [y0]; y = y0; t = torch.tensor(t0)
    for i in range(n):
        k1 = f(t, y)
        k2 = f(t + dt / 2, y + dt / 2 * k1)
        k3 = f(t + dt / 2, y + dt / 2 * k2)
        k4 = f(t + dt, y + dt * k3)
        y = y + dt / 6 * (k1 + 2 * k2 + 2 * k3 + k4)
        t = t + dt; ys.append(y)
    return torch.stack(ys)
enc = nn.Sequential(nn.Linear(3, 128), nn.GELU(), nn.Linear(128, D))
dyn = Dyn()
dec = nn.Sequential(nn.Linear(D, 64), nn.GELU(), nn.Linear(64, 3))
params = list(enc.parameters()) + list(dyn.parameters()) + list(dec.parameters())
opt = torch.optim.Adam(params, lr=3e-3)
g = torch.Generator().manual_seed(1)
x0 = torch.randn(3, B, P, 3, generator=g)
ang = torch.linspace(0, 1.5, NSTEP + 1)
rot = torch.stack([torch.stack([ang.cos(), -ang.sin(), torch.zeros_like(ang)], -1), torch.stack([ang.sin(), ang.cos(), torch.zeros_like(ang)], -1), torch.tensor([0., 0., 1.]).expand(NSTEP + 1, 3)], -2)
target_traj = torch.einsum("tij,sbpj->stbpi", rot, x0) * torch.linspace(1, 0.7, NSTEP + 1)[None, :, None, None, None]
target_set = torch.randn(3, B, Q, 3, generator=g) * 0.8
losses = []
for step in range(3):
    opt.zero_grad()
    z = rk4(dyn, enc(x0[step]), 0.0, 1.0, NSTEP)          # (T+1, B, P, D)
    pts = dec(z)                                            # (T+1, B, P, 3)
    traj_loss = F.mse_loss(pts, target_traj[step])
    d = torch.cdist(pts[-1], target_set[step])              # (B, P, Q)
    chamfer = d.min(2).values.mean() + d.min(1).values.mean()
    loss = traj_loss + 0.1 * chamfer
    loss.backward()
    torch.nn.utils.clip_grad_norm_(params, 5.0)
    opt.step()
    losses += [traj_loss.detach(), chamfer.detach(), z[-1].detach().norm()]
losses.append(dyn.nfe)
losses.append(opt.state[dyn.l2.weight]["exp_avg_sq"].sum())
report(policy, [enc, dyn, dec], losses)
