# Untuned: a discrete VAE (DALL-E style dVAE, Jang et al.'s categorical VAE) on random 3x32x32
# "images". Conv encoder (BatchNorm2d, LeakyReLU(inplace=True), a residual block) to logits over
# NTOK codes on an 8x8 grid; latent codes drawn by F.gumbel_softmax(logits, tau, hard=True, dim=1) -
# a one-hot in the forward pass with the soft sample's gradient - (HARD=0: the soft relaxation);
# the codebook applied by torch.einsum("bnhw,nd->bdhw") on the one-hot; temperature annealed per step
# by max(0.5, exp(-r * step)). KL of the softmax posterior to a uniform categorical, computed as
# (q * (log q + log NTOK)).sum over codes with log_softmax; a ConvTranspose decoder with Upsample
# (nearest) and a Tanh output, a BCE-with-logits reconstruction on pixels in [0, 1] and the KL
# weighted by a warm-up factor. Adam with a LambdaLR warm-up, 3 steps; the code usage (bincount of
# argmax codes) logged as a perplexity; finally codes for a batch sampled from the prior under no_grad
# by torch.multinomial and decoded.
import math, os, torch, torch.nn as nn, torch.nn.functional as F
from common import setup, report
policy = setup()
torch.use_deterministic_algorithms(True)
B, NTOK, DC, HARD = 48, 256, 64, os.environ.get("HARD", "1") == "1"
class Res(nn.Module):
    def __init__(s, c): super().__init__(); s.b = nn.Sequential(nn.Conv2d(c, c, 3, padding=1), nn.BatchNorm2d(c), nn.LeakyReLU(0.2, inplace=True), nn.Conv2d(c, c, 3, padding=1))
    def forward(s, x): return F.leaky_relu(x + s.b(x), 0.2)
class DVAE(nn.Module):
    def __init__(s):
        super().__init__()
        s.enc = nn.Sequential(nn.Conv2d(3, 64, 4, 2, 1), nn.BatchNorm2d(64), nn.LeakyReLU(0.2, inplace=True),
                              nn.Conv2d(64, 128, 4, 2, 1), nn.BatchNorm2d(128), nn.LeakyReLU(0.2, inplace=True),
                              Res(128), nn.Conv2d(128, NTOK, 1))
        s.codebook = nn.Parameter(torch.randn(NTOK, DC) * 0.1)
        s.dec = nn.Sequential(nn.Conv2d(DC, 128, 3, padding=1), nn.ReLU(inplace=True), Res(128),
                              nn.Upsample(scale_factor=2, mode="nearest"), nn.Conv2d(128, 64, 3, padding=1), nn.ReLU(inplace=True),
                              nn.ConvTranspose2d(64, 32, 4, 2, 1), nn.ReLU(inplace=True), nn.Conv2d(32, 3, 1))
    def forward(s, x, tau):
        logits = s.enc(x)
        z = F.gumbel_softmax(logits, tau=tau, hard=HARD, dim=1)
        emb = torch.einsum("bnhw,nd->bdhw", z, s.codebook)
        logq = F.log_softmax(logits, dim=1)
        kl = (logq.exp() * (logq + math.log(NTOK))).sum(1).mean()
        return s.dec(emb), kl, logits
model = DVAE()
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda st: min(1.0, (st + 1) / 2))
g = torch.Generator().manual_seed(1)
losses = []
for step in range(3):
    x = torch.sigmoid(F.interpolate(torch.randn(B, 3, 8, 8, generator=g) * 2, size=32, mode="bilinear", align_corners=False))
    tau = max(0.5, math.exp(-0.3 * step))
    xr, kl, logits = model(x * 2 - 1, tau)
    rec = F.binary_cross_entropy_with_logits(xr, x, reduction="sum") / B
    loss = rec + min(1.0, 0.1 * (step + 1)) * kl
    opt.zero_grad()
    loss.backward()
    opt.step()
    sched.step()
    with torch.no_grad():
        usage = torch.bincount(logits.argmax(1).flatten(), minlength=NTOK).float()
        p = usage / usage.sum()
        perp = torch.exp(-(p * torch.log(p + 1e-10)).sum())
    losses += [loss.detach(), perp]
model.eval()
with torch.no_grad():
    codes = torch.multinomial(torch.full((NTOK,), 1.0 / NTOK), 4 * 8 * 8, replacement=True, generator=g).view(4, 8, 8)
    oh = F.one_hot(codes, NTOK).permute(0, 3, 1, 2).float()
    losses.append(torch.sigmoid(model.dec(torch.einsum("bnhw,nd->bdhw", oh, model.codebook))).sum())
report(policy, [model], losses)
