# Untuned: inspecting and saving in the middle of training with activations around. A small
# transformer-ish encoder whose attention block stores a detached activation on itself
# (self.last_attn = attn.detach()) and whose feature block registers an activation as a
# non-persistent buffer each forward (register_buffer("feat", h.detach(), persistent=False)). Between
# forward and backward of step 1: print() and repr() of an activation, .tolist() and
# .detach().cpu().numpy() of a small activation and .tolist() of slices of the stored ones (logging), torch.equal / torch.allclose between
# activations. After step 1: torch.save({"model": state_dict, "opt": opt.state_dict(), "last_attn":
# ...}, io.BytesIO()), torch.load back and compare; copy.deepcopy(model) (buffers and the stored
# attention come along) and a forward of the copy under no_grad. Checksums of all of it are reported.
# Only the first attention and feature blocks keep their activations; KEEP_ALL=1: all three do.
# Adam, 3 steps.
import copy, io, os, torch, torch.nn as nn, torch.nn.functional as F
from common import setup, report
policy = setup()
B, T, D, H, C = 32, 96, 128, 4, 10
class Attn(nn.Module):
    def __init__(s, keep=True):
        super().__init__()
        s.keep = keep
        s.norm = nn.LayerNorm(D); s.qkv = nn.Linear(D, 3 * D); s.out = nn.Linear(D, D)
        s.last_attn = None
    def forward(s, x):
        q, k, v = s.qkv(s.norm(x)).view(B_ := x.shape[0], T, 3, H, D // H).permute(2, 0, 3, 1, 4)
        attn = torch.softmax(q @ k.transpose(-1, -2) / (D // H) ** 0.5, dim=-1)
        if s.keep: s.last_attn = attn.detach()
        return x + s.out((attn @ v).transpose(1, 2).reshape(B_, T, D))
class Feat(nn.Module):
    def __init__(s, keep=True):
        super().__init__()
        s.keep = keep
        s.norm = nn.LayerNorm(D); s.f1 = nn.Linear(D, 4 * D); s.f2 = nn.Linear(4 * D, D)
        s.register_buffer("feat", torch.zeros(0), persistent=False)
    def forward(s, x):
        h = F.gelu(s.f1(s.norm(x)))
        if s.keep: s.register_buffer("feat", h.detach(), persistent=False)
        return x + s.f2(h)
class Net(nn.Module):
    def __init__(s):
        super().__init__()
        s.inp = nn.Linear(16, D)
        k = bool(os.environ.get("KEEP_ALL"))  # KEEP_ALL=1: every block keeps its activations
        s.block = Attn(); s.ff = Feat(); s.block2 = Attn(k); s.ff2 = Feat(k); s.block3 = Attn(k); s.ff3 = Feat(k)
        s.head = nn.Linear(D, C)
    def forward(s, x):
        h = s.ff3(s.block3(s.ff2(s.block2(s.ff(s.block(s.inp(x)))))))
        return s.head(h.mean(1)), h
def csum(t): return t.detach().sum()
model = Net()
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
g = torch.Generator().manual_seed(1)
losses = []
for step in range(3):
    x = torch.randn(B, T, 16, generator=g)
    y = torch.randint(0, C, (B,), generator=g)
    logits, h = model(x)
    loss = F.cross_entropy(logits, y)
    if step == 1:
        small = logits[:2, :4]
        text = repr(h[0, :2, :3]) + str(small)
        print(h[:1, :1, :4], file=__import__("sys").stderr)
        lst = small.tolist()
        arr = small.detach().cpu().numpy()
        attn_row = model.block.last_attn[0, 0, 0, :6].tolist()
        feat_row = model.ff.feat[0, 0, :6].tolist()
        attn_arr = model.block.last_attn[0, 0, :2, :5].cpu().numpy()
        losses += [torch.tensor(sum(map(sum, lst))), torch.tensor(float(arr.sum())), torch.tensor(float(attn_arr.sum())), torch.tensor(sum(attn_row)), torch.tensor(sum(feat_row)),
                   torch.tensor(float(len(text)))]
        losses += [torch.tensor(float(torch.equal(model.block.last_attn, model.block.last_attn[:1].expand_as(model.block.last_attn)))),
                   torch.tensor(float(torch.allclose(model.ff.feat, model.ff.feat.clone()))),
                   torch.tensor(float(torch.allclose(h, h + 1e-9, atol=1e-6)))]
    opt.zero_grad()
    loss.backward()
    opt.step()
    losses += [loss.detach(), csum(model.block.last_attn), csum(model.ff.feat)]
    if step == 1:
        buf = io.BytesIO()
        torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "last_attn": model.block.last_attn,
                    "feat": model.ff.feat[:2], "h": h[:, 0]}, buf)
        buf.seek(0)
        ck = torch.load(buf)
        losses += [csum(ck["last_attn"]), csum(ck["feat"]), csum(ck["h"]),
                   torch.tensor(float(torch.equal(ck["last_attn"], model.block.last_attn))),
                   torch.tensor(float(all(torch.equal(v, model.state_dict()[k]) for k, v in ck["model"].items()))),
                   sum(s["exp_avg_sq"].sum() for s in ck["opt"]["state"].values())]
        twin = copy.deepcopy(model)
        losses += [csum(twin.block.last_attn), csum(twin.ff.feat)]
        with torch.no_grad():
            tl, th = twin(x[:8])
        losses += [csum(tl), csum(th), csum(twin.block.last_attn)]
        losses += [csum(p) for p in twin.parameters()]
        del twin, ck, buf
report(policy, [model], losses)
