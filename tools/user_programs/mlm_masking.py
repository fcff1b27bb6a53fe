# Untuned: a BERT-style masked language model whose batch is masked inside the training loop, in
# place: labels = ids.clone(), bernoulli(0.15) selection, labels[~m] = -100, 80% of the selected ids
# set to [MASK] and 10% to random tokens by torch.randint, written with boolean-mask assignment.
# Attention with a key padding mask, GELU FFN, cross_entropy(ignore_index=-100), plus a SimCLR-style
# contrastive loss on the [CLS] embeddings of two dropout views (cosine similarity matrix,
# fill_diagonal_(-inf), cross_entropy against the other view's index).
import math, torch, torch.nn as nn, torch.nn.functional as F
from common import setup, report
policy = setup()
torch.use_deterministic_algorithms(True)
V, D, H, L, B, T = 400, 96, 4, 3, 16, 48
PAD, CLS, MASK = 0, 1, 2
class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.qkv, self.o = nn.Linear(D, 3 * D), nn.Linear(D, D)
        self.ln1, self.ln2 = nn.LayerNorm(D), nn.LayerNorm(D)
        self.fc1, self.fc2 = nn.Linear(D, 4 * D), nn.Linear(4 * D, D)
        self.drop = nn.Dropout(0.1)
    def forward(self, x, pad):
        q, k, v = self.qkv(x).view(x.size(0), T, 3, H, D // H).permute(2, 0, 3, 1, 4)
        s = q @ k.transpose(-2, -1) / math.sqrt(D // H)
        s = s.masked_fill(pad[:, None, None, :], torch.finfo(s.dtype).min)
        a = self.drop(F.softmax(s, dim=-1))
        x = self.ln1(x + self.drop(self.o((a @ v).transpose(1, 2).reshape(x.size(0), T, D))))
        return self.ln2(x + self.drop(self.fc2(F.gelu(self.fc1(x)))))
class Bert(nn.Module):
    def __init__(self):
        super().__init__()
        self.tok, self.pos = nn.Embedding(V, D, padding_idx=PAD), nn.Embedding(T, D)
        self.ln = nn.LayerNorm(D)
        self.blocks = nn.ModuleList(Block() for _ in range(L))
        self.head = nn.Sequential(nn.Linear(D, D), nn.GELU(), nn.LayerNorm(D))
        self.decoder_bias = nn.Parameter(torch.zeros(V))
        self.proj = nn.Sequential(nn.Linear(D, D), nn.ReLU(), nn.Linear(D, 64))
    def forward(self, ids):
        pad = ids == PAD
        x = F.dropout(self.ln(self.tok(ids) + self.pos.weight), 0.1, self.training)
        for b in self.blocks: x = b(x, pad)
        return x
    def mlm_logits(self, x):
        return self.head(x) @ self.tok.weight.t() + self.decoder_bias
def mask_tokens(ids, g):
    labels = ids.clone()
    prob = torch.full(ids.shape, 0.15)
    prob.masked_fill_((ids == PAD) | (ids == CLS), 0.0)
    m = torch.bernoulli(prob, generator=g).bool()
    labels[~m] = -100
    replaced = (torch.rand(ids.shape, generator=g) < 0.8) & m
    ids[replaced] = MASK
    rnd = (torch.rand(ids.shape, generator=g) < 0.5) & m & ~replaced
    ids[rnd] = torch.randint(3, V, ids.shape, generator=g)[rnd]
    return ids, labels
g = torch.Generator().manual_seed(1)
model = Bert()
opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
losses = []
for step in range(3):
    ids = torch.randint(3, V, (B, T), generator=g)
    lens = torch.randint(T // 2, T + 1, (B,), generator=g)
    ids[torch.arange(T)[None, :] >= lens[:, None]] = PAD
    ids[:, 0] = CLS
    ids, labels = mask_tokens(ids, g)
    h1 = model(ids)
    h2 = model(ids)  # second dropout view
    mlm = F.cross_entropy(model.mlm_logits(h1).view(-1, V), labels.view(-1), ignore_index=-100)
    z = F.normalize(model.proj(torch.cat([h1[:, 0], h2[:, 0]])), dim=-1)
    sim = z @ z.t() / 0.1
    sim.fill_diagonal_(float("-inf"))
    target = torch.cat([torch.arange(B, 2 * B), torch.arange(B)])
    con = F.cross_entropy(sim, target)
    loss = mlm + 0.5 * con
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    losses += [mlm.detach(), con.detach(), labels.ne(-100).sum()]
report(policy, [model], losses)
