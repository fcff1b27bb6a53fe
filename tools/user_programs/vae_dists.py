# Untuned: a convolutional VAE written with torch.distributions: the encoder (Conv2d + GroupNorm +
# SiLU) gives a Normal posterior sampled with rsample(), kl_divergence against a standard Normal,
# a decoder of ConvTranspose2d layers plus one F.interpolate (bilinear) upsampling, and a
# Bernoulli(logits=...).log_prob reconstruction term on binarized images. Adam, 3 steps.
import torch, torch.nn as nn, torch.nn.functional as F
from torch.distributions import Normal, Bernoulli, kl_divergence
from common import setup, report
policy = setup()
class VAE(nn.Module):
    def __init__(self, z_dim=32):
        super().__init__()
        self.enc = nn.Sequential(
            nn.Conv2d(1, 32, 3, padding=1), nn.GroupNorm(8, 32), nn.SiLU(),
            nn.Conv2d(32, 64, 4, stride=2, padding=1), nn.GroupNorm(8, 64), nn.SiLU(),   # 32x32
            nn.Conv2d(64, 64, 4, stride=2, padding=1), nn.GroupNorm(8, 64), nn.SiLU(),   # 16x16
            nn.Conv2d(64, 128, 4, stride=2, padding=1), nn.GroupNorm(8, 128), nn.SiLU(), # 8x8
        )
        self.to_stats = nn.Linear(128 * 8 * 8, 2 * z_dim)
        self.from_z = nn.Linear(z_dim, 128 * 8 * 8)
        self.dec1 = nn.Sequential(nn.ConvTranspose2d(128, 64, 4, stride=2, padding=1), nn.GroupNorm(8, 64), nn.SiLU())  # 16x16
        self.dec2 = nn.Sequential(nn.ConvTranspose2d(64, 32, 4, stride=2, padding=1), nn.GroupNorm(8, 32), nn.SiLU())   # 32x32
        self.dec3 = nn.Sequential(nn.Conv2d(32, 32, 3, padding=1), nn.GroupNorm(8, 32), nn.SiLU(),
                                  nn.Conv2d(32, 1, 3, padding=1))
    def encode(self, x):
        h = self.enc(x).flatten(1)
        mu, log_var = self.to_stats(h).chunk(2, dim=1)
        return Normal(mu, torch.exp(0.5 * log_var))
    def decode(self, z):
        h = self.from_z(z).view(-1, 128, 8, 8)
        h = self.dec2(self.dec1(h))
        h = F.interpolate(h, scale_factor=2, mode="bilinear", align_corners=False)  # 64x64
        return self.dec3(h)
    def forward(self, x):
        q = self.encode(x)
        z = q.rsample()
        return self.decode(z), q
model = VAE()
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
g = torch.Generator().manual_seed(1)
losses = []
for step in range(3):
    x = (torch.rand(32, 1, 64, 64, generator=g) > 0.5).float()
    logits, q = model(x)
    prior = Normal(torch.zeros_like(q.loc), torch.ones_like(q.scale))
    kl = kl_divergence(q, prior).sum(dim=1).mean()
    rec = -Bernoulli(logits=logits).log_prob(x).sum(dim=(1, 2, 3)).mean()
    loss = rec + kl
    opt.zero_grad()
    loss.backward()
    opt.step()
    losses += [loss.detach(), kl.detach()]
report(policy, [model], losses)
