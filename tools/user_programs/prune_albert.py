# Untuned: ALBERT-like encoder with magnitude pruning. torch.nn.utils.prune.l1_unstructured on the
# shared block's FFN Linear and on a token-mixing Conv1d before training (forward recomputes
# weight = weight_orig * weight_mask in a forward pre-hook on every call); one transformer block
# (LayerNorm, Linear qkv, attention by matmul/softmax, GELU FFN) whose weights are shared, applied 4
# times in a loop; nn.Embedding(max_norm=1.0) (renormalizes its rows in place during forward);
# masked-token cross-entropy; SGD with nesterov momentum. 3 steps.
import math, torch, torch.nn as nn, torch.nn.functional as F
import torch.nn.utils.prune as prune
from common import setup, report
policy = setup()
torch.use_deterministic_algorithms(True)
V, E, D, H, FF, S, B, LAYERS = 1000, 64, 128, 4, 512, 128, 32, 4
class SharedBlock(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln1 = nn.LayerNorm(D)
        self.qkv = nn.Linear(D, 3 * D)
        self.proj = nn.Linear(D, D)
        self.ln2 = nn.LayerNorm(D)
        self.ffn1 = nn.Linear(D, FF)
        self.ffn2 = nn.Linear(FF, D)
    def forward(self, x, mask):
        b, s, _ = x.shape
        h = self.ln1(x)
        q, k, v = self.qkv(h).split(D, dim=-1)
        q = q.view(b, s, H, D // H).transpose(1, 2)
        k = k.view(b, s, H, D // H).transpose(1, 2)
        v = v.view(b, s, H, D // H).transpose(1, 2)
        scores = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(D // H)
        scores = scores.masked_fill(mask[:, None, None, :] == 0, float("-inf"))
        attn = F.softmax(scores, dim=-1)
        ctx = torch.matmul(attn, v).transpose(1, 2).reshape(b, s, D)
        x = x + self.proj(ctx)
        x = x + self.ffn2(F.gelu(self.ffn1(self.ln2(x))))
        return x
class Albert(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(V, E, max_norm=1.0)
        self.pos = nn.Parameter(torch.zeros(S, E))
        self.mix = nn.Conv1d(E, E, 5, padding=2)
        self.embed_proj = nn.Linear(E, D)
        self.block = SharedBlock()
        self.ln = nn.LayerNorm(D)
        self.head = nn.Linear(D, V)
    def forward(self, ids, mask):
        x = self.embed(ids) + self.pos
        x = x + self.mix(x.transpose(1, 2)).transpose(1, 2)
        x = self.embed_proj(x)
        for _ in range(LAYERS):
            x = self.block(x, mask)
        return self.head(self.ln(x))
model = Albert()
prune.l1_unstructured(model.block.ffn1, name="weight", amount=0.3)
prune.l1_unstructured(model.mix, name="weight", amount=0.5)
model.train()
opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, nesterov=True, weight_decay=1e-5)
g = torch.Generator().manual_seed(1)
losses = []
for step in range(3):
    ids = torch.randint(1, V, (B, S), generator=g)
    lengths = torch.randint(S // 2, S + 1, (B,), generator=g)
    mask = (torch.arange(S)[None, :] < lengths[:, None]).long()
    masked = (torch.rand(B, S, generator=g) < 0.15) & (mask == 1)
    labels = ids.masked_fill(~masked, -100)
    inp = ids.masked_fill(masked, 0)
    logits = model(inp, mask)
    loss = F.cross_entropy(logits.view(-1, V), labels.view(-1), ignore_index=-100)
    opt.zero_grad()
    loss.backward()
    opt.step()
    losses.append(loss.detach())
report(policy, [model], losses)
