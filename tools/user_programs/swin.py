# Untuned: Swin-style classifier. Patch embed conv, window partition via view/permute/contiguous,
# shifted windows via torch.roll with the paper's slice-built attention mask, relative position
# bias from a parameter table + registered index buffer, patch merging, LayerNorm, GELU MLP, AdamW.
import torch, torch.nn as nn, torch.nn.functional as F
from common import setup, report
policy = setup()
torch.use_deterministic_algorithms(True)
B, IMG, NCLS = 16, 64, 10
def window_partition(x, ws):
    B, H, W, C = x.shape
    x = x.view(B, H // ws, ws, W // ws, ws, C)
    return x.permute(0, 1, 3, 2, 4, 5).contiguous().view(-1, ws, ws, C)
def window_reverse(w, ws, H, W):
    B = int(w.shape[0] / (H * W / ws / ws))
    x = w.view(B, H // ws, W // ws, ws, ws, -1)
    return x.permute(0, 1, 3, 2, 4, 5).contiguous().view(B, H, W, -1)
class WindowAttention(nn.Module):
    def __init__(s, dim, ws, heads):
        super().__init__()
        s.dim, s.ws, s.heads = dim, ws, heads; s.scale = (dim // heads) ** -0.5
        s.table = nn.Parameter(torch.zeros((2 * ws - 1) * (2 * ws - 1), heads))
        nn.init.trunc_normal_(s.table, std=.02)
        coords = torch.stack(torch.meshgrid(torch.arange(ws), torch.arange(ws), indexing="ij"))
        cf = torch.flatten(coords, 1)
        rel = (cf[:, :, None] - cf[:, None, :]).permute(1, 2, 0).contiguous()
        rel[:, :, 0] += ws - 1; rel[:, :, 1] += ws - 1; rel[:, :, 0] *= 2 * ws - 1
        s.register_buffer("rel_index", rel.sum(-1))
        s.qkv = nn.Linear(dim, dim * 3); s.proj = nn.Linear(dim, dim); s.drop = nn.Dropout(0.1)
    def forward(s, x, mask=None):
        B_, N, C = x.shape
        qkv = s.qkv(x).reshape(B_, N, 3, s.heads, C // s.heads).permute(2, 0, 3, 1, 4)
        q, k, v = qkv[0], qkv[1], qkv[2]
        attn = (q * s.scale) @ k.transpose(-2, -1)
        bias = s.table[s.rel_index.view(-1)].view(N, N, -1).permute(2, 0, 1).contiguous()
        attn = attn + bias.unsqueeze(0)
        if mask is not None:
            nW = mask.shape[0]
            attn = attn.view(B_ // nW, nW, s.heads, N, N) + mask.unsqueeze(1).unsqueeze(0)
            attn = attn.view(-1, s.heads, N, N)
        attn = s.drop(attn.softmax(-1))
        x = (attn @ v).transpose(1, 2).reshape(B_, N, C)
        return s.proj(x)
class SwinBlock(nn.Module):
    def __init__(s, dim, res, heads, ws, shift):
        super().__init__()
        s.res, s.ws, s.shift = res, ws, shift
        s.n1 = nn.LayerNorm(dim); s.attn = WindowAttention(dim, ws, heads)
        s.n2 = nn.LayerNorm(dim); s.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))
        if shift > 0:
            H = W = res
            img_mask = torch.zeros((1, H, W, 1))
            cnt = 0
            for h in (slice(0, -ws), slice(-ws, -shift), slice(-shift, None)):
                for w in (slice(0, -ws), slice(-ws, -shift), slice(-shift, None)):
                    img_mask[:, h, w, :] = cnt; cnt += 1
            mw = window_partition(img_mask, ws).view(-1, ws * ws)
            am = mw.unsqueeze(1) - mw.unsqueeze(2)
            am = am.masked_fill(am != 0, float(-100.0)).masked_fill(am == 0, float(0.0))
        else: am = None
        s.register_buffer("attn_mask", am)
    def forward(s, x):
        H = W = s.res; B, L, C = x.shape
        sc = x
        x = s.n1(x).view(B, H, W, C)
        if s.shift > 0: x = torch.roll(x, shifts=(-s.shift, -s.shift), dims=(1, 2))
        xw = window_partition(x, s.ws).view(-1, s.ws * s.ws, C)
        aw = s.attn(xw, mask=s.attn_mask).view(-1, s.ws, s.ws, C)
        x = window_reverse(aw, s.ws, H, W)
        if s.shift > 0: x = torch.roll(x, shifts=(s.shift, s.shift), dims=(1, 2))
        x = sc + x.view(B, H * W, C)
        return x + s.mlp(s.n2(x))
class PatchMerging(nn.Module):
    def __init__(s, res, dim):
        super().__init__(); s.res = res; s.norm = nn.LayerNorm(4 * dim); s.red = nn.Linear(4 * dim, 2 * dim, bias=False)
    def forward(s, x):
        H = W = s.res; B, L, C = x.shape
        x = x.view(B, H, W, C)
        x0 = x[:, 0::2, 0::2, :]; x1 = x[:, 1::2, 0::2, :]; x2 = x[:, 0::2, 1::2, :]; x3 = x[:, 1::2, 1::2, :]
        x = torch.cat([x0, x1, x2, x3], -1).view(B, -1, 4 * C)
        return s.red(s.norm(x))
class Swin(nn.Module):
    def __init__(s, dim=48, depths=(2, 2, 2), heads=(2, 4, 8), ws=4, patch=2):
        super().__init__()
        s.pe = nn.Conv2d(3, dim, patch, stride=patch); s.pen = nn.LayerNorm(dim)
        res = IMG // patch; layers = []
        for i, (d, h) in enumerate(zip(depths, heads)):
            for j in range(d): layers.append(SwinBlock(dim, res, h, ws, 0 if j % 2 == 0 else ws // 2))
            if i < len(depths) - 1: layers.append(PatchMerging(res, dim)); res //= 2; dim *= 2
        s.layers = nn.Sequential(*layers); s.norm = nn.LayerNorm(dim); s.head = nn.Linear(dim, NCLS)
    def forward(s, x):
        x = s.pen(s.pe(x).flatten(2).transpose(1, 2))
        x = s.norm(s.layers(x))
        return s.head(x.mean(1))
model = Swin()
opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.05)
g = torch.Generator().manual_seed(1)
xs = torch.randn(3, B, 3, IMG, IMG, generator=g); ys = torch.randint(0, NCLS, (3, B), generator=g)
losses = []
for step in range(3):
    out = model(xs[step])
    loss = F.cross_entropy(out, ys[step])
    opt.zero_grad()
    loss.backward()
    opt.step()
    losses.append(loss.detach())
report(policy, [model], losses)
