# Untuned: a VQ-VAE on random 3x32x32 "images" with an EMA codebook. Conv encoder (stride-2 convs,
# ReLU, residual blocks) to a (B, D, 4, 4) grid, flattened to vectors; the codebook lookup by
# torch.cdist against the embedding buffer + argmin, the quantised vectors by F.embedding, the
# straight-through estimator z + (q - z).detach(), commitment loss beta * mse(z, q.detach()).
# Codebook updates under no_grad as in the paper's EMA variant: one_hot of the codes, cluster sizes
# by sum, per-code sums by index_add_ (one codebook) or one_hot^T @ z (the other), both with mul_/
# add_ (alpha=1-decay) into buffers, Laplace smoothing of the counts, embedding.copy_(sum / n).
# Dead-code restarts every step: codes used by no vector in the batch (cluster size below a
# threshold) are overwritten by randperm-chosen encoder outputs (index_copy_). Two quantisers: the
# whole vector, and a second residual quantiser on what the first left. ConvTranspose decoder, MSE
# reconstruction + commitment, Adam, 3 steps; the perplexity of the codes is logged.
import torch, torch.nn as nn, torch.nn.functional as F
from common import setup, report
policy = setup()
torch.use_deterministic_algorithms(True)
B, D, NCODE, DECAY, EPS, BETA = 64, 32, 128, 0.99, 1e-5, 0.25
class ResBlock(nn.Module):
    def __init__(s, c): super().__init__(); s.net = nn.Sequential(nn.ReLU(), nn.Conv2d(c, c, 3, padding=1), nn.ReLU(), nn.Conv2d(c, c, 1))
    def forward(s, x): return x + s.net(x)
class EMAQuantizer(nn.Module):
    def __init__(s, use_index_add):
        super().__init__(); s.use_index_add = use_index_add
        s.register_buffer("embedding", torch.randn(NCODE, D))
        s.register_buffer("cluster_size", torch.zeros(NCODE))
        s.register_buffer("embed_sum", s.embedding.clone())
    def forward(s, z):                                   # z: (N, D)
        dist = torch.cdist(z.detach(), s.embedding)
        codes = dist.argmin(1)
        q = F.embedding(codes, s.embedding)
        if s.training:
            with torch.no_grad():
                onehot = F.one_hot(codes, NCODE).type(z.dtype)
                s.cluster_size.mul_(DECAY).add_(onehot.sum(0), alpha=1 - DECAY)
                if s.use_index_add:
                    dw = torch.zeros_like(s.embed_sum).index_add_(0, codes, z)
                else:
                    dw = onehot.t() @ z
                s.embed_sum.mul_(DECAY).add_(dw, alpha=1 - DECAY)
                n = s.cluster_size.sum()
                size = (s.cluster_size + EPS) / (n + NCODE * EPS) * n          # Laplace smoothing
                s.embedding.copy_(s.embed_sum / size.unsqueeze(1))
                dead = (onehot.sum(0) == 0).nonzero().squeeze(1)
                if dead.numel() > 0:
                    pick = torch.randperm(z.shape[0])[:dead.numel()]
                    s.embedding.index_copy_(0, dead, z[pick])
                    s.embed_sum.index_copy_(0, dead, z[pick])
                    s.cluster_size.index_fill_(0, dead, 1.0)
        commit = F.mse_loss(z, q.detach())
        avg = F.one_hot(codes, NCODE).float().mean(0)
        perplexity = torch.exp(-(avg * torch.log(avg + 1e-10)).sum())
        return z + (q - z).detach(), commit, perplexity
class VQVAE(nn.Module):
    def __init__(s):
        super().__init__()
        s.enc = nn.Sequential(nn.Conv2d(3, 32, 4, 2, 1), ResBlock(32), ResBlock(32), nn.ReLU(), nn.Conv2d(32, 64, 4, 2, 1), nn.ReLU(),
                              nn.Conv2d(64, 64, 4, 2, 1), ResBlock(64), ResBlock(64), nn.ReLU(), nn.Conv2d(64, D, 1))
        s.q1, s.q2 = EMAQuantizer(True), EMAQuantizer(False)
        s.dec = nn.Sequential(nn.Conv2d(D, 64, 3, padding=1), ResBlock(64), ResBlock(64), nn.ReLU(),
                              nn.ConvTranspose2d(64, 64, 4, 2, 1), nn.ReLU(), nn.ConvTranspose2d(64, 32, 4, 2, 1), ResBlock(32), ResBlock(32), nn.ReLU(), nn.ConvTranspose2d(32, 3, 4, 2, 1))
    def forward(s, x):
        ze = s.enc(x)
        b, d, h, w = ze.shape
        z = ze.permute(0, 2, 3, 1).reshape(-1, d)
        q1, c1, p1 = s.q1(z)
        q2, c2, p2 = s.q2(z - q1.detach())
        q = (q1 + q2).view(b, h, w, d).permute(0, 3, 1, 2)
        return s.dec(q), c1 + c2, p1
model = VQVAE()
opt = torch.optim.Adam(model.parameters(), lr=2e-4)
g = torch.Generator().manual_seed(1)
losses = []
for step in range(3):
    x = torch.tanh(F.interpolate(torch.randn(B, 3, 8, 8, generator=g), size=32, mode="bilinear", align_corners=False))
    xr, commit, perp = model(x)
    rec = F.mse_loss(xr, x)
    loss = rec + BETA * commit
    opt.zero_grad()
    loss.backward()
    opt.step()
    losses += [loss.detach(), perp.detach()]
model.eval()
with torch.no_grad(): losses.append(model(x)[0].square().sum())
report(policy, [model], losses)
