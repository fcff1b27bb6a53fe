# Untuned: a decoder-only tagger on variable-length sequences. Lengths drawn per step,
# pad_sequence(batch_first=True) builds the batch, a boolean key_padding_mask and a causal
# attn_mask (boolean triu) go to nn.MultiheadAttention(batch_first=True, need_weights=True,
# average_attn_weights=False) whose per-head weights enter an auxiliary "attend locally" loss;
# then nn.TransformerDecoderLayer(norm_first=True) layers (self-attention with tgt_mask and
# tgt_key_padding_mask, cross-attention over a memory from a small encoder MLP with
# memory_key_padding_mask); label-smoothed cross entropy on logits[mask] (boolean-mask indexing:
# shapes depend on the lengths). Adam. Five steps.
import torch, torch.nn as nn, torch.nn.functional as F
from torch.nn.utils.rnn import pad_sequence
from common import setup, report
policy = setup()
torch.use_deterministic_algorithms(True)
V, D, H, B = 200, 128, 4, 12
class Model(nn.Module):
    def __init__(s):
        super().__init__()
        s.emb = nn.Embedding(V, D, padding_idx=0); s.pos = nn.Parameter(torch.randn(128, D) * 0.02)
        s.mha = nn.MultiheadAttention(D, H, dropout=0.1, batch_first=True)
        s.ln = nn.LayerNorm(D)
        s.enc = nn.Sequential(nn.Linear(16, D), nn.GELU(), nn.Linear(D, D))
        s.dec = nn.ModuleList(nn.TransformerDecoderLayer(D, H, 4 * D, dropout=0.1, batch_first=True, norm_first=True)
                              for _ in range(2))
        s.out = nn.Linear(D, V)
    def forward(s, tok, pad, mem, mem_pad):
        T = tok.shape[1]
        causal = torch.triu(torch.ones(T, T, dtype=torch.bool), 1)
        x = s.emb(tok) + s.pos[:T]
        a, w = s.mha(s.ln(x), s.ln(x), s.ln(x), key_padding_mask=pad, attn_mask=causal,
                     need_weights=True, average_attn_weights=False)
        x = x + a
        m = s.enc(mem)
        for layer in s.dec:
            x = layer(x, m, tgt_mask=causal, tgt_key_padding_mask=pad, memory_key_padding_mask=mem_pad,
                      tgt_is_causal=True)
        return s.out(x), w
model = Model()
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
g = torch.Generator().manual_seed(1)
crit = nn.CrossEntropyLoss(label_smoothing=0.1)
losses = []
for step in range(5):
    lens = torch.randint(20, 96, (B,), generator=g)
    seqs = [torch.randint(1, V, (int(n),), generator=g) for n in lens]
    tok = pad_sequence(seqs, batch_first=True, padding_value=0)
    T = tok.shape[1]
    pad = tok == 0
    mlens = torch.randint(5, 30, (B,), generator=g)
    mem = pad_sequence([torch.randn(int(n), 16, generator=g) for n in mlens], batch_first=True)
    mem_pad = torch.arange(mem.shape[1])[None] >= mlens[:, None]
    logits, w = model(tok[:, :-1], pad[:, :-1], mem, mem_pad)
    tgt = tok[:, 1:]; valid = ~pad[:, 1:]
    loss = crit(logits[valid], tgt[valid])
    # auxiliary: per-head attention mass within 8 positions of the diagonal
    Tq = T - 1
    near = (torch.arange(Tq)[:, None] - torch.arange(Tq)[None]).abs() <= 8
    local = (w * near).sum(-1)[valid.unsqueeze(1).expand(-1, H, -1)]
    aux = (1 - local).mean()
    total = loss + 0.1 * aux
    opt.zero_grad(); total.backward(); opt.step()
    losses += [loss.detach(), aux.detach(), torch.tensor(float(valid.sum()))]
report(policy, [model], losses)
