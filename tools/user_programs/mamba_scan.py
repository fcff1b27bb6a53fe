# Untuned: a Mamba-style selective state-space language model in plain torch (no kernels). Each
# block: RMSNorm (hand-written: x * rsqrt(mean(x^2) + eps) * w), in_proj to (x, z), depthwise
# causal Conv1d (groups = channels, padding k-1, sliced back to L) over a transpose, SiLU, x_proj to
# (dt, B, C), dt = softplus(dt_proj(dt)), A = -exp(A_log), discretised dA = exp(dt A) and
# dBx = dt B x via einsum, then the selective scan, y = <h, C> + D x, gated by silu(z), out_proj,
# residual. Three scan variants, one per layer: (0) a per-timestep Python loop h = dA[:, t] * h +
# dBx[:, t] with torch.stack of the outputs; (1) chunked: within a chunk, log-decays cumsum'd and a
# masked segment-sum matrix exp(S_t - S_s) (tril, masked_fill -inf) applied with einsum, the state
# carried across chunks by a loop; (2) cumprod of dA and cumsum of dBx / cumprod within short
# chunks. Tied embedding/head, next-token cross-entropy, AdamW with grad clipping, 3 steps.
import math, torch, torch.nn as nn, torch.nn.functional as F
from common import setup, report
policy = setup()
torch.use_deterministic_algorithms(True)
V, Dm, E, N, R, K, Bsz, L = 256, 64, 128, 16, 8, 4, 8, 96
class RMSNorm(nn.Module):
    def __init__(s, d, eps=1e-6): super().__init__(); s.w = nn.Parameter(torch.ones(d)); s.eps = eps
    def forward(s, x): return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + s.eps) * s.w
class MambaBlock(nn.Module):
    def __init__(s, mode):
        super().__init__(); s.mode = mode
        s.norm = RMSNorm(Dm)
        s.in_proj = nn.Linear(Dm, 2 * E, bias=False)
        s.conv = nn.Conv1d(E, E, K, groups=E, padding=K - 1)
        s.x_proj = nn.Linear(E, R + 2 * N, bias=False)
        s.dt_proj = nn.Linear(R, E)
        with torch.no_grad(): s.dt_proj.bias.fill_(math.log(math.expm1(0.05)))   # dt ~ 0.05 at init
        s.A_log = nn.Parameter(torch.log(torch.arange(1, N + 1, dtype=torch.float32)).repeat(E, 1))
        s.D = nn.Parameter(torch.ones(E))
        s.out_proj = nn.Linear(E, Dm, bias=False)
    def scan(s, dA, dBx, C):
        Bb, Ll = dA.shape[:2]
        if s.mode == 0:
            h = dA.new_zeros(Bb, E, N); ys = []
            for t in range(Ll):
                h = dA[:, t] * h + dBx[:, t]
                ys.append(torch.einsum("ben,bn->be", h, C[:, t]))
            return torch.stack(ys, 1)
        if s.mode == 1:
            Q = 16; h = dA.new_zeros(Bb, E, N); ys = []
            mask = torch.ones(Q, Q, dtype=torch.bool).tril()
            for c in range(0, Ll, Q):
                la = torch.log(dA[:, c:c + Q])                         # (B, Q, E, N)
                S = la.cumsum(1)
                seg = (S.unsqueeze(2) - S.unsqueeze(1))                # (B, t, s, E, N)
                seg = seg.masked_fill(~mask[None, :, :, None, None], float("-inf")).exp()
                hs = torch.einsum("btsen,bsen->bten", seg, dBx[:, c:c + Q]) + S.exp() * h.unsqueeze(1)
                ys.append(torch.einsum("bten,btn->bte", hs, C[:, c:c + Q]))
                h = hs[:, -1]
            return torch.cat(ys, 1)
        Q = 8; h = dA.new_zeros(Bb, E, N); ys = []
        for c in range(0, Ll, Q):
            P = torch.cumprod(dA[:, c:c + Q], 1)
            hs = P * (h.unsqueeze(1) + torch.cumsum(dBx[:, c:c + Q] / P, 1))
            ys.append((hs * C[:, c:c + Q, None, :]).sum(-1))
            h = hs[:, -1]
        return torch.cat(ys, 1)
    def forward(s, u):
        x, z = s.in_proj(s.norm(u)).chunk(2, -1)
        x = F.silu(s.conv(x.transpose(1, 2))[..., :u.shape[1]].transpose(1, 2))
        dt, Bm, Cm = s.x_proj(x).split([R, N, N], -1)
        dt = F.softplus(s.dt_proj(dt))                                 # (B, L, E)
        A = -torch.exp(s.A_log)                                        # (E, N)
        dA = torch.exp(torch.einsum("ble,en->blen", dt, A))
        dBx = torch.einsum("ble,bln,ble->blen", dt, Bm, x)
        y = s.scan(dA, dBx, Cm) + x * s.D
        return u + s.out_proj(y * F.silu(z))
class LM(nn.Module):
    def __init__(s):
        super().__init__()
        s.emb = nn.Embedding(V, Dm); nn.init.normal_(s.emb.weight, std=0.02); s.blocks = nn.ModuleList([MambaBlock(m) for m in (0, 1, 2)])
        s.norm = RMSNorm(Dm)
    def forward(s, tok):
        h = s.emb(tok)
        for b in s.blocks: h = b(h)
        return s.norm(h) @ s.emb.weight.t()
model = LM()
opt = torch.optim.AdamW(model.parameters(), lr=2e-3)
g = torch.Generator().manual_seed(1)
losses = []
for step in range(3):
    tok = torch.randint(0, V, (Bsz, L + 1), generator=g)
    logits = model(tok[:, :-1])
    loss = F.cross_entropy(logits.reshape(-1, V), tok[:, 1:].reshape(-1))
    opt.zero_grad()
    loss.backward()
    gn = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    losses += [loss.detach(), gn]
with torch.no_grad(): losses.append(model(tok[:, :-1]).square().sum())
report(policy, [model], losses)
