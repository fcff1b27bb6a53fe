# Untuned: speech-enhancement-style training on complex spectrograms of random "clean" waveforms
# (sums of random sinusoids) plus noise. torch.stft (hann window buffer, return_complex=True) of the
# noisy waveform; the network sees log1p(abs) and view_as_real(spec) (permuted to channels) through
# a small Conv2d + BatchNorm + PReLU stack with a frequency-wise GRU-free bottleneck (a Linear over
# the frequency axis) and predicts a complex mask: two channels permuted last, .contiguous(),
# view_as_complex; bounded in magnitude with tanh(abs(m)) and kept in phase by angle(m), rebuilt
# with torch.polar. The masked spectrum is spec * mask * a per-frequency complex nn.Parameter
# (cfloat) gain, mixed across frequencies by a complex (F, F) matrix parameter near the identity
# (est^T @ W by matmul: a complex linear layer over frequency), then torch.istft(length=...) back
# to a waveform. Loss: L1 on the waveform plus MSE of compressed magnitudes (abs ** 0.3; POWER=1:
# the power as (est * est.conj()).real, ** 0.15) against the clean spectrum's. Adam (with the
# complex parameters), 3 steps.
import math, os, torch, torch.nn as nn, torch.nn.functional as F
from common import setup, report
policy = setup()
torch.use_deterministic_algorithms(True)
B, L, NFFT, HOP, CH = 3, 6000, 256, 64, 16
NF = NFFT // 2 + 1
class Enhancer(nn.Module):
    def __init__(s):
        super().__init__()
        s.register_buffer("window", torch.hann_window(NFFT))
        def blk(i, o): return nn.Sequential(nn.Conv2d(i, o, 3, padding=1), nn.BatchNorm2d(o), nn.PReLU(o))
        s.enc = nn.Sequential(blk(3, CH), blk(CH, CH), blk(CH, CH))
        s.freq = nn.Linear(NF, NF)
        s.dec = nn.Sequential(blk(2 * CH, CH), blk(CH, CH), nn.Conv2d(CH, 2, 1))
        s.gain = nn.Parameter(torch.ones(NF, dtype=torch.cfloat))
        s.fmix = nn.Parameter(torch.eye(NF, dtype=torch.cfloat) + 0.01 * torch.randn(NF, NF, dtype=torch.cfloat))
    def forward(s, wav):
        spec = torch.stft(wav, NFFT, HOP, window=s.window, return_complex=True)       # (B, F, T)
        feats = torch.cat([torch.log1p(spec.abs()).unsqueeze(1), torch.view_as_real(spec).permute(0, 3, 1, 2)], 1)
        h = s.enc(feats)                                                              # (B, CH, F, T)
        hf = s.freq(h.transpose(2, 3)).transpose(2, 3)                                # mix over frequency
        m = s.dec(torch.cat([h, F.relu(hf)], 1))                                      # (B, 2, F, T)
        m = torch.view_as_complex(m.permute(0, 2, 3, 1).contiguous())
        m = torch.polar(torch.tanh(m.abs()), m.angle())
        est = spec * m * s.gain[None, :, None]
        est = (est.transpose(1, 2) @ s.fmix).transpose(1, 2)
        return torch.istft(est, NFFT, HOP, window=s.window, length=wav.shape[-1]), est
model = Enhancer()
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
g = torch.Generator().manual_seed(1)
t = torch.arange(L) / 8000.0
win = torch.hann_window(NFFT)
losses = []
for step in range(3):
    f0 = 100 + 1500 * torch.rand(B, 5, 1, generator=g)
    clean = (torch.sin(2 * math.pi * f0 * t + 6.28 * torch.rand(B, 5, 1, generator=g)) * torch.rand(B, 5, 1, generator=g)).sum(1) * 0.2
    noisy = clean + 0.1 * torch.randn(B, L, generator=g)
    out, est = model(noisy)
    cspec = torch.stft(clean, NFFT, HOP, window=win, return_complex=True)
    if os.environ.get("POWER") == "1":          # |X|^2 as X * conj(X), as much audio code writes it
        pw = (est * est.conj()).real.clamp_min(1e-8)
        loss = F.l1_loss(out, clean) + F.mse_loss(pw ** 0.15, cspec.abs() ** 0.3)
    else:
        loss = F.l1_loss(out, clean) + F.mse_loss(est.abs() ** 0.3, cspec.abs() ** 0.3)
    opt.zero_grad()
    loss.backward()
    opt.step()
    losses += [loss.detach(), model.gain.grad.abs().sum()]
model.eval()
with torch.no_grad(): losses.append(model(noisy)[0].square().sum())
report(policy, [model], losses)
