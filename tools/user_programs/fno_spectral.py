# Untuned: a 2-D Fourier Neural Operator on a random Darcy-like problem, as the reference code
# writes it. The input grid (a(x), x, y) lifted by nn.Linear on channels-last, permuted to (B, C, H,
# W); four Fourier layers: torch.fft.rfft2 of the activation, the lowest MODES x MODES frequencies
# (positive and negative rows) multiplied by complex weights (nn.Parameter of torch.cfloat, scaled
# torch.rand) through torch.einsum("bixy,ioxy->boxy"), written into a zeros tensor of complex dtype
# by slice assignment, irfft2 back with s=(H, W); plus a pointwise 1x1 Conv2d, GELU between layers.
# Projection by two Linears. A relative L2 loss (norm of the difference over norm of the target,
# per sample, then mean), AdamW with StepLR, 3 steps; the target is the solution of a smoothing
# operator applied in Fourier space (fft2 times a decaying filter, real part of ifft2). (REALW=1: the
# older code's real weights of shape (..., 2) turned complex by torch.view_as_complex in forward, and
# the modes multiplied by a hand-written complex product on view_as_real of the spectrum.)
import os, torch, torch.nn as nn, torch.nn.functional as F
from common import setup, report
policy = setup()
torch.use_deterministic_algorithms(True)
B, S, WIDTH, MODES, REALW = 8, 64, 24, 12, os.environ.get("REALW") == "1"
class SpectralConv2d(nn.Module):
    def __init__(s, cin, cout, m1, m2):
        super().__init__(); s.m1, s.m2, s.cout = m1, m2, cout
        scale = 1 / (cin * cout)
        shape, dt = ((cin, cout, m1, m2, 2), torch.float) if REALW else ((cin, cout, m1, m2), torch.cfloat)
        s.weights1 = nn.Parameter(scale * torch.rand(*shape, dtype=dt))
        s.weights2 = nn.Parameter(scale * torch.rand(*shape, dtype=dt))
    def compl_mul2d(s, x, w):
        if not REALW: return torch.einsum("bixy,ioxy->boxy", x, w)
        xr, wr = torch.view_as_real(x), w
        re = torch.einsum("bixy,ioxy->boxy", xr[..., 0], wr[..., 0]) - torch.einsum("bixy,ioxy->boxy", xr[..., 1], wr[..., 1])
        im = torch.einsum("bixy,ioxy->boxy", xr[..., 0], wr[..., 1]) + torch.einsum("bixy,ioxy->boxy", xr[..., 1], wr[..., 0])
        return torch.view_as_complex(torch.stack([re, im], -1))
    def forward(s, x):
        b = x.shape[0]
        x_ft = torch.fft.rfft2(x)
        out_ft = torch.zeros(b, s.cout, x.size(-2), x.size(-1) // 2 + 1, dtype=torch.cfloat, device=x.device)
        out_ft[:, :, :s.m1, :s.m2] = s.compl_mul2d(x_ft[:, :, :s.m1, :s.m2], s.weights1)
        out_ft[:, :, -s.m1:, :s.m2] = s.compl_mul2d(x_ft[:, :, -s.m1:, :s.m2], s.weights2)
        return torch.fft.irfft2(out_ft, s=(x.size(-2), x.size(-1)))
class FNO2d(nn.Module):
    def __init__(s):
        super().__init__()
        s.fc0 = nn.Linear(3, WIDTH)
        s.convs = nn.ModuleList(SpectralConv2d(WIDTH, WIDTH, MODES, MODES) for _ in range(4))
        s.ws = nn.ModuleList(nn.Conv2d(WIDTH, WIDTH, 1) for _ in range(4))
        s.fc1, s.fc2 = nn.Linear(WIDTH, 128), nn.Linear(128, 1)
    def get_grid(s, shape):
        b, sx, sy = shape[0], shape[1], shape[2]
        gx = torch.linspace(0, 1, sx).reshape(1, sx, 1, 1).repeat(b, 1, sy, 1)
        gy = torch.linspace(0, 1, sy).reshape(1, 1, sy, 1).repeat(b, sx, 1, 1)
        return torch.cat((gx, gy), dim=-1)
    def forward(s, a):                                    # a: (B, S, S, 1)
        x = torch.cat((a, s.get_grid(a.shape)), dim=-1)
        x = s.fc0(x).permute(0, 3, 1, 2)
        for i, (sc, w) in enumerate(zip(s.convs, s.ws)):
            x = sc(x) + w(x)
            if i < 3: x = F.gelu(x)
        x = x.permute(0, 2, 3, 1)
        return s.fc2(F.gelu(s.fc1(x)))
def rel_l2(pred, y):
    diff = torch.norm(pred.reshape(pred.shape[0], -1) - y.reshape(y.shape[0], -1), 2, 1)
    return (diff / torch.norm(y.reshape(y.shape[0], -1), 2, 1)).mean()
model = FNO2d()
opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=1e-4)
sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
g = torch.Generator().manual_seed(1)
k = torch.fft.fftfreq(S) * S
filt = 1.0 / (1.0 + (k[:, None] ** 2 + k[None, :] ** 2))
losses = []
for step in range(3):
    a = (torch.randn(B, S, S, generator=g) > 0).float() * 9 + 3
    y = torch.fft.ifft2(torch.fft.fft2(1.0 / a) * filt).real.unsqueeze(-1)
    pred = model(a.unsqueeze(-1))
    loss = rel_l2(pred, y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    sched.step()
    losses.append(loss.detach())
report(policy, [model], losses)
