# Untuned: a small model whose memory is dominated by two very large activations, written the way
# someone who never thought about memory writes it. One full (not flash, not chunked) causal
# single-head attention over a long sequence (2 x 2,048 tokens), by hand: the B x T x T score matrix
# (32 MiB), its masked copy and its softmax (32 MiB each; softmax's backward makes another); then a
# "bilinear pairing" by broadcasting an outer product u[..., :, None] * w[..., None, :] (B x T x 64 x
# 16, 16 MiB) reduced by amax; and an untied output projection onto a large vocabulary (32,768) for
# the last 256 tokens of each sequence at once, the 512 x V logits (64 MiB) fed to F.cross_entropy
# with label smoothing (its backward builds another 64 MiB logits gradient; the embedding's and the
# head's weight gradients are 8 MiB each). Beside them a sidecar of many small tensors: the pooled
# sequence vector goes through 120 tiny Linear(64, 64) + GELU layers at batch 2 (512 bytes each),
# and a per-token gate runs 24 small elementwise ops (1 MiB each). AdamW, three steps.
import torch, torch.nn as nn, torch.nn.functional as F
from common import setup, report
policy = setup()
torch.use_deterministic_algorithms(True)
B, T, D, V, P, NSIDE, TAIL = 2, 2048, 64, 32768, 16, 120, 256
class Model(nn.Module):
    def __init__(s):
        super().__init__()
        s.emb = nn.Embedding(V, D)
        s.q, s.k, s.v, s.o = (nn.Linear(D, D) for _ in range(4))
        s.n1, s.n2 = nn.LayerNorm(D), nn.LayerNorm(D)
        s.pu, s.pv = nn.Linear(D, D), nn.Linear(D, P)
        s.pw = nn.Linear(P, D)
        s.side = nn.ModuleList(nn.Linear(D, D) for _ in range(NSIDE))
        s.gate = nn.Parameter(torch.ones(D))
        s.head = nn.Linear(D, V)
    def forward(s, ids):
        x = s.emb(ids)
        h = s.n1(x)
        q, k, v = s.q(h), s.k(h), s.v(h)
        scores = q @ k.transpose(1, 2) / D ** 0.5                      # B x T x T: 32 MiB
        mask = torch.ones(T, T, dtype=torch.bool).triu(1)
        scores = scores.masked_fill(mask, float("-inf"))
        att = torch.softmax(scores, -1)                               # another 32 MiB
        x = x + s.o(att @ v)
        # pairing: an outer product with a 16-wide projection, max over the pairing axis
        u = torch.tanh(s.pu(s.n2(x)))                                  # B x T x D
        w = torch.sigmoid(s.pv(x))                                     # B x T x P
        outer = u[:, :, :, None] * w[:, :, None, :]                    # B x T x D x P: 16 MiB
        x = x + 0.1 * outer.amax(-1) + 0.01 * s.pw(w)
        # the sidecar: many tiny tensors
        z = x.mean(1)
        for lin in s.side:
            z = z + 0.1 * F.gelu(lin(z))
        g = x
        for i in range(24):
            g = g * torch.sigmoid(s.gate * (1 + i / 24)) + 0.01 * z[:, None, :]
        x = x + 0.1 * g
        return s.head(x[:, -TAIL:]).reshape(B * TAIL, V), z                # 64 MiB logits
model = Model()
opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
g = torch.Generator().manual_seed(1)
losses = []
for step in range(3):
    ids = torch.randint(0, V, (B, T + 1), generator=g)
    logits, z = model(ids[:, :-1])
    loss = F.cross_entropy(logits, ids[:, -TAIL:].reshape(-1), label_smoothing=0.1) + 1e-3 * z.square().mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    losses += [loss.detach(), z.detach().abs().mean()]
report(policy, [model], losses)
