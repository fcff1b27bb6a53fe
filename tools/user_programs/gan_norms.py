"""A small GAN-ish autoencoder: spectral_norm convs (power iteration on buffers in forward),
GroupNorm, ConvTranspose2d, F.interpolate, PixelShuffle, Embedding(max_norm) class codes
(renormalised in place in forward), Adam with two param groups."""
from common import *
from torch import nn
from torch.nn import functional as F
from torch.nn.utils import spectral_norm
policy = setup()
class AE(nn.Module):
    def __init__(s):
        super().__init__()
        s.code = nn.Embedding(10, 32, max_norm=1.0)
        s.enc = nn.Sequential(spectral_norm(nn.Conv2d(3, 32, 3, 2, 1)), nn.GroupNorm(8, 32), nn.SiLU(),
                              spectral_norm(nn.Conv2d(32, 64, 3, 2, 1)), nn.GroupNorm(8, 64), nn.SiLU())
        s.film = nn.Linear(32, 64)
        s.dec1 = nn.ConvTranspose2d(64, 32, 4, 2, 1); s.gn = nn.GroupNorm(8, 32)
        s.dec2 = nn.Conv2d(32, 12, 3, 1, 1); s.ps = nn.PixelShuffle(2)
    def forward(s, x, c):
        h = s.enc(x) * (1 + s.film(s.code(c)))[:, :, None, None]
        h = F.silu(s.gn(s.dec1(h)))
        h = F.interpolate(h, scale_factor=1.0, mode="bilinear", align_corners=False)
        return torch.tanh(s.ps(s.dec2(h)))
m = AE(); opt = torch.optim.Adam([{"params": m.enc.parameters(), "lr": 1e-3}, {"params": [p for n, p in m.named_parameters() if not n.startswith("enc")], "lr": 3e-4}])
g = torch.Generator().manual_seed(1); losses = []
for step in range(3):
    x = torch.rand(48, 3, 64, 64, generator=g) * 2 - 1; c = torch.randint(0, 10, (48,), generator=g)
    loss = F.l1_loss(m(x, c), x) + 0.1 * F.mse_loss(m(x.flip(-1), c), x.flip(-1))
    opt.zero_grad(); loss.backward(); opt.step(); losses.append(loss.item())
report(policy, [m], losses)
