# Untuned: very wide fan-out, written as someone prototyping a "many heads" model would: one hidden
# state (batch 1024, width 256) is read by 500 small heads, each an nn.Linear(256, 16) in an
# nn.ModuleList walked by a Python loop, their outputs summed (and every 10th head's also kept for a
# per-head loss term). The 500 head outputs are then joined by a deep stack of torch.cat: pieces of
# 25 are cat'ed, those 20 blocks cat'ed again in pairs, and pairs of pairs, down to one tensor, which
# is viewed back as (batch, heads, 16), averaged over the heads and read by a Linear. A clone of the
# hidden state is edited in place through views, column by column (h2[:, i].mul_(g[:, i]) for 64
# columns, h2[:, 64 + i].add_(...) for 64 more, h2[i::8] sliced rows scaled by addcmul_), and the
# edited clone is read both by the next layer and, untouched again, by the loss. SGD with momentum and Nesterov, three steps. (HEADS=N: N heads instead of 500.)
import os, torch, torch.nn as nn, torch.nn.functional as F
from common import setup, report
policy = setup()
torch.use_deterministic_algorithms(True)
B, D, K, HEADS = 1024, 256, 16, int(os.environ.get("HEADS", "500"))
class Net(nn.Module):
    def __init__(s):
        super().__init__()
        s.stem = nn.Sequential(nn.Linear(64, D), nn.GELU(), nn.Linear(D, D))
        s.heads = nn.ModuleList(nn.Linear(D, K) for _ in range(HEADS))
        s.gate = nn.Linear(D, D)
        s.join = nn.Linear(K, D)
        s.post = nn.Linear(D, D)
        s.out = nn.Linear(D + K, 10)
    def forward(s, x):
        h = torch.tanh(s.stem(x))
        acc, kept, outs = 0, [], []
        for i, head in enumerate(s.heads):
            o = head(h)
            acc = acc + o
            outs.append(o)
            if i % 10 == 0:
                kept.append(F.gelu(o).square().mean())
        # a deep tree of cats over the 500 pieces
        level = [torch.cat(outs[j:j + 25], 1) for j in range(0, len(outs), 25)]
        while len(level) > 1:
            level = [torch.cat(level[j:j + 2], 1) for j in range(0, len(level), 2)]
        joined = s.join(level[0].view(B, HEADS, K).mean(1))
        # in-place edits of a clone through views, column by column
        g = torch.sigmoid(s.gate(h))
        h2 = h.clone()
        for i in range(64):
            h2[:, i].mul_(g[:, i])
        for i in range(64):
            h2[:, 64 + i].add_(joined[:, i], alpha=0.5)
        for i in range(8):
            h2[i::8].addcmul_(g[i::8], joined[i::8], value=0.1)
        z = F.gelu(s.post(h2)) + joined
        logits = s.out(torch.cat([z, acc / HEADS], 1))
        return logits, torch.stack(kept).sum(), h2
model = Net()
opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, nesterov=True)
g = torch.Generator().manual_seed(1)
losses = []
for step in range(3):
    x = torch.randn(B, 64, generator=g)
    y = torch.randint(0, 10, (B,), generator=g)
    logits, aux, h2 = model(x)
    loss = F.cross_entropy(logits, y) + 0.01 * aux + 1e-3 * h2.square().mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    losses += [loss.detach(), aux.detach(), h2.detach().sum()]
report(policy, [model], losses)
