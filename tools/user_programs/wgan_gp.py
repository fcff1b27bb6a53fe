# Untuned: WGAN-GP on random 32x32 "images". DCGAN-style generator (Linear -> view -> ConvTranspose2d
# with BatchNorm2d and ReLU, Tanh out) and a critic with no batch norm (Conv2d + LayerNorm over
# (C, H, W) + LeakyReLU, Linear out). Gradient penalty: interpolates eps*real + (1-eps)*fake.detach()
# with requires_grad_(), critic scores, torch.autograd.grad(create_graph=True, retain_graph=True)
# of the scores, (||grad||_2 - 1)^2 * 10. n_critic = 3 critic steps (fresh noise, fresh real
# batch) per generator step, generator frozen with requires_grad_(False) during critic steps and
# critic frozen during the generator step. Two Adam optimizers (betas 0.0, 0.9). 3 generator steps.
import torch, torch.nn as nn, torch.nn.functional as F
from common import setup, report
policy = setup()
torch.use_deterministic_algorithms(True)
B, Z, NC, LAM = 48, 64, 3, 10.0
class Gen(nn.Module):
    def __init__(s):
        super().__init__()
        s.fc = nn.Linear(Z, 128 * 4 * 4)
        s.net = nn.Sequential(
            nn.BatchNorm2d(128), nn.ReLU(True),
            nn.ConvTranspose2d(128, 64, 4, 2, 1), nn.BatchNorm2d(64), nn.ReLU(True),
            nn.ConvTranspose2d(64, 32, 4, 2, 1), nn.BatchNorm2d(32), nn.ReLU(True),
            nn.ConvTranspose2d(32, NC, 4, 2, 1), nn.Tanh())
    def forward(s, z): return s.net(s.fc(z).view(-1, 128, 4, 4))
class Critic(nn.Module):
    def __init__(s):
        super().__init__()
        s.net = nn.Sequential(
            nn.Conv2d(NC, 32, 3, 1, 1), nn.LeakyReLU(0.2),
            nn.Conv2d(32, 64, 4, 2, 1), nn.LayerNorm([64, 16, 16]), nn.LeakyReLU(0.2),
            nn.Conv2d(64, 128, 4, 2, 1), nn.LayerNorm([128, 8, 8]), nn.LeakyReLU(0.2),
            nn.Conv2d(128, 128, 4, 2, 1), nn.LeakyReLU(0.2), nn.Flatten())
        s.fc = nn.Linear(128 * 4 * 4, 1)
    def forward(s, x): return s.fc(s.net(x)).squeeze(1)
G, D = Gen(), Critic()
optG = torch.optim.Adam(G.parameters(), lr=1e-4, betas=(0.0, 0.9))
optD = torch.optim.Adam(D.parameters(), lr=1e-4, betas=(0.0, 0.9))
g = torch.Generator().manual_seed(1)
def real_batch():
    base = torch.randn(B, NC, 8, 8, generator=g)
    return torch.tanh(F.interpolate(base, size=32, mode="bilinear", align_corners=False))
def gradient_penalty(real, fake):
    eps = torch.rand(real.shape[0], 1, 1, 1, generator=g)
    xi = (eps * real + (1 - eps) * fake).requires_grad_(True)
    scores = D(xi)
    grad, = torch.autograd.grad(scores, xi, grad_outputs=torch.ones_like(scores),
                                create_graph=True, retain_graph=True)
    return ((grad.flatten(1).norm(2, dim=1) - 1) ** 2).mean()
losses = []
for it in range(3):
    G.requires_grad_(False); D.requires_grad_(True)
    for _ in range(3):
        real = real_batch()
        z = torch.randn(B, Z, generator=g)
        fake = G(z).detach()
        d_real, d_fake = D(real).mean(), D(fake).mean()
        gp = gradient_penalty(real, fake)
        loss_d = d_fake - d_real + LAM * gp
        optD.zero_grad(set_to_none=True)
        loss_d.backward()
        optD.step()
        losses += [loss_d.detach(), gp.detach()]
    G.requires_grad_(True); D.requires_grad_(False)
    z = torch.randn(B, Z, generator=g)
    loss_g = -D(G(z)).mean()
    optG.zero_grad(set_to_none=True)
    loss_g.backward()
    optG.step()
    losses.append(loss_g.detach())
G.eval()
with torch.no_grad(): losses.append(G(torch.randn(4, Z, generator=g)).square().sum())
report(policy, [G, D], losses)
