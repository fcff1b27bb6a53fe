# Untuned: an Autoformer-style forecaster (Wu et al. 2021) on synthetic seasonal series with trend.
# Series decomposition by a moving average (avg_pool1d over the series padded at both ends by cat
# of its repeated first and last steps); auto-correlation by torch.fft.rfft/irfft of the queries
# times the conjugated keys; the top-k delays by topk on the correlation averaged over heads,
# channels and batch (.item() per delay); time-delay aggregation by torch.roll in a Python loop
# over the k delays, weighted by a softmax of their correlations (GATHER=1: per-sample delays, by
# gather on an index built from arange over the series repeated twice); a token embedding by a
# circular Conv1d plus a linear time-feature embedding; two encoder layers and one decoder layer
# (self and cross auto-correlation) whose three trends are summed, projected by a circular conv and
# accumulated onto the trend initialised from the input's; a seasonal layer norm; MSE on the
# forecast, AdamW, 3 steps.
import math, os, torch, torch.nn as nn, torch.nn.functional as F
from common import setup, report
policy = setup()
B, C, LIN, LABEL, PRED, DM, H, DFF, KMA, FACTOR, TF, P = 32, 7, 96, 48, 48, 128, 8, 256, 25, 3, 4, 0.05
GATHER = os.environ.get("GATHER") == "1"
class Decomp(nn.Module):
    def forward(s, x):                       # x (B, L, D): (seasonal, trend)
        front = x[:, :1].repeat(1, (KMA - 1) // 2, 1)
        end = x[:, -1:].repeat(1, (KMA - 1) // 2, 1)
        xp = torch.cat([front, x, end], 1)
        trend = F.avg_pool1d(xp.permute(0, 2, 1), KMA, stride=1).permute(0, 2, 1)
        return x - trend, trend
class AutoCorrelation(nn.Module):
    def __init__(s):
        super().__init__()
        s.q, s.k, s.v, s.o = (nn.Linear(DM, DM) for _ in range(4))
        s.drop = nn.Dropout(P)
    def aggregate(s, values, corr):          # values, corr (B, H, E, L)
        L = values.shape[-1]
        top_k = int(FACTOR * math.log(L))
        mean_value = corr.mean(1).mean(1)    # (B, L)
        if not GATHER:
            index = torch.topk(mean_value.mean(0), top_k, dim=-1)[1]
            weights = torch.stack([mean_value[:, index[i]] for i in range(top_k)], -1)
            tmp_corr = torch.softmax(weights, -1)
            agg = torch.zeros_like(values)
            for i in range(top_k):
                pattern = torch.roll(values, -int(index[i]), -1)
                agg = agg + pattern * tmp_corr[:, i][:, None, None, None]
            return agg
        weights, delay = torch.topk(mean_value, top_k, dim=-1)
        tmp_corr = torch.softmax(weights, -1)
        init_index = torch.arange(L)[None, None, None].repeat(values.shape[0], H, values.shape[2], 1)
        tmp_values = values.repeat(1, 1, 1, 2)
        agg = torch.zeros_like(values)
        for i in range(top_k):
            tmp_delay = init_index + delay[:, i][:, None, None, None]
            pattern = torch.gather(tmp_values, -1, tmp_delay)
            agg = agg + pattern * tmp_corr[:, i][:, None, None, None]
        return agg
    def forward(s, xq, xk, xv):
        b, L, _ = xq.shape; S = xk.shape[1]
        q = s.q(xq).view(b, L, H, -1); k = s.k(xk).view(b, S, H, -1); v = s.v(xv).view(b, S, H, -1)
        if L > S:
            z = torch.zeros_like(q[:, :L - S]); k = torch.cat([k, z], 1); v = torch.cat([v, z], 1)
        else:
            k, v = k[:, :L], v[:, :L]
        qf = torch.fft.rfft(q.permute(0, 2, 3, 1).contiguous(), dim=-1)
        kf = torch.fft.rfft(k.permute(0, 2, 3, 1).contiguous(), dim=-1)
        corr = torch.fft.irfft(qf * torch.conj(kf), n=L, dim=-1)
        out = s.aggregate(v.permute(0, 2, 3, 1).contiguous(), corr).permute(0, 3, 1, 2)
        return s.o(s.drop(out.reshape(b, L, DM)))
class SeasonalNorm(nn.Module):
    def __init__(s):
        super().__init__(); s.ln = nn.LayerNorm(DM)
    def forward(s, x):
        x = s.ln(x)
        return x - x.mean(1, keepdim=True)
class FF(nn.Module):
    def __init__(s):
        super().__init__()
        s.c1, s.c2 = nn.Conv1d(DM, DFF, 1, bias=False), nn.Conv1d(DFF, DM, 1, bias=False); s.drop = nn.Dropout(P)
    def forward(s, x):
        y = s.drop(F.gelu(s.c1(x.transpose(1, 2))))
        return s.drop(s.c2(y).transpose(1, 2))
class EncLayer(nn.Module):
    def __init__(s):
        super().__init__(); s.attn, s.ff, s.d1, s.d2, s.drop = AutoCorrelation(), FF(), Decomp(), Decomp(), nn.Dropout(P)
    def forward(s, x):
        x, _ = s.d1(x + s.drop(s.attn(x, x, x)))
        res, _ = s.d2(x + s.ff(x))
        return res
class DecLayer(nn.Module):
    def __init__(s):
        super().__init__()
        s.self_attn, s.cross_attn, s.ff = AutoCorrelation(), AutoCorrelation(), FF()
        s.d1, s.d2, s.d3, s.drop = Decomp(), Decomp(), Decomp(), nn.Dropout(P)
        s.proj = nn.Conv1d(DM, C, 3, padding=1, padding_mode="circular", bias=False)
    def forward(s, x, cross):
        x, t1 = s.d1(x + s.drop(s.self_attn(x, x, x)))
        x, t2 = s.d2(x + s.drop(s.cross_attn(x, cross, cross)))
        x, t3 = s.d3(x + s.ff(x))
        trend = s.proj((t1 + t2 + t3).permute(0, 2, 1)).transpose(1, 2)
        return x, trend
class Embed(nn.Module):
    def __init__(s):
        super().__init__()
        s.tok = nn.Conv1d(C, DM, 3, padding=1, padding_mode="circular", bias=False); s.time = nn.Linear(TF, DM, bias=False)
        s.drop = nn.Dropout(P)
    def forward(s, x, mark):
        return s.drop(s.tok(x.permute(0, 2, 1)).transpose(1, 2) + s.time(mark))
class Autoformer(nn.Module):
    def __init__(s):
        super().__init__()
        s.decomp = Decomp(); s.enc_emb, s.dec_emb = Embed(), Embed()
        s.enc = nn.ModuleList(EncLayer() for _ in range(2)); s.enc_norm = SeasonalNorm()
        s.dec = nn.ModuleList(DecLayer() for _ in range(1)); s.dec_norm = SeasonalNorm()
        s.out = nn.Linear(DM, C)
    def forward(s, x_enc, mark_enc, mark_dec):
        mean = x_enc.mean(1, keepdim=True).repeat(1, PRED, 1)
        zeros = torch.zeros(x_enc.shape[0], PRED, C)
        seasonal, trend = s.decomp(x_enc)
        trend = torch.cat([trend[:, -LABEL:], mean], 1)
        seasonal = torch.cat([seasonal[:, -LABEL:], zeros], 1)
        e = s.enc_emb(x_enc, mark_enc)
        for l in s.enc: e = l(e)
        e = s.enc_norm(e)
        d = s.dec_emb(seasonal, mark_dec)
        for l in s.dec:
            d, rt = l(d, e)
            trend = trend + rt
        d = s.out(s.dec_norm(d))
        return (trend + d)[:, -PRED:]
def series(g, n, L, t0):
    t = (t0 + torch.arange(L)).float()[None, :, None]
    per = torch.randint(12, 30, (n, 1, C), generator=g).float()
    ph = torch.rand(n, 1, C, generator=g) * 6.28
    slope = torch.randn(n, 1, C, generator=g) * 0.01
    x = torch.sin(2 * math.pi * t / per + ph) + 0.5 * torch.sin(2 * math.pi * t / 7 + ph) + slope * t
    marks = torch.stack([(t[0, :, 0] % 24) / 23 - 0.5, (t[0, :, 0] // 24 % 7) / 6 - 0.5,
                         (t[0, :, 0] % 7) / 6 - 0.5, (t[0, :, 0] % 30) / 29 - 0.5], -1)
    return x + 0.1 * torch.randn(x.shape, generator=g), marks[None].expand(n, -1, -1)
model = Autoformer()
opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
g = torch.Generator().manual_seed(13)
losses = []
for step in range(3):
    x, marks = series(g, B, LIN + PRED, step * 17)
    x_enc, y = x[:, :LIN], x[:, LIN:]
    mark_enc, mark_dec = marks[:, :LIN], marks[:, LIN - LABEL:]
    pred = model(x_enc, mark_enc, mark_dec)
    loss = F.mse_loss(pred, y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    losses += [loss.detach(), pred.detach().abs().mean()]
report(policy, [model], losses)
