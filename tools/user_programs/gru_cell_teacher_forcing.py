# Untuned: a character-level language model unrolled by hand for 64 steps per batch: an nn.Embedding,
# a GRUCell and an LSTMCell stacked (LayerNorm between), a Linear to the vocabulary, every step in
# Python with its many small tensors. Teacher forcing mixed with the model's own samples: per example
# and step, torch.rand < ratio picks the gold character, otherwise one drawn by
# torch.multinomial(softmax(logits / temperature).detach(), 1) (the global generator), chosen by
# torch.where; a per-step cross entropy summed over the 64 steps (divided by 64 at the end). The
# hidden states (h1, h2, c2) are carried across batches detached (truncated BPTT on a stream of
# consecutive chunks), the last character of one chunk feeding the next. Adam, clip_grad_norm_, the
# teacher-forcing ratio decayed each step. Four steps.
import torch, torch.nn as nn, torch.nn.functional as F
from common import setup, report
policy = setup()
torch.use_deterministic_algorithms(True)
V, E, H, B, T = 96, 64, 256, 128, 64
class CharDecoder(nn.Module):
    def __init__(s):
        super().__init__()
        s.emb = nn.Embedding(V, E)
        s.gru = nn.GRUCell(E, H)
        s.ln = nn.LayerNorm(H)
        s.lstm = nn.LSTMCell(H, H)
        s.out = nn.Linear(H, V)
    def step(s, ch, h1, h2, c2):
        h1 = s.gru(s.emb(ch), h1)
        h2, c2 = s.lstm(s.ln(h1), (h2, c2))
        return s.out(F.dropout(h2, 0.1, s.training)), h1, h2, c2
model = CharDecoder()
opt = torch.optim.Adam(model.parameters(), lr=2e-3)
g = torch.Generator().manual_seed(1)
# a stream of "text": a random Markov chain over the characters, B parallel streams
trans = torch.softmax(torch.randn(V, V, generator=g) * 3, 1)
stream = torch.empty(B, 4 * T + 1, dtype=torch.long)
stream[:, 0] = torch.randint(0, V, (B,), generator=g)
for t in range(1, 4 * T + 1):
    stream[:, t] = torch.multinomial(trans[stream[:, t - 1]], 1, generator=g).squeeze(1)
h1 = torch.zeros(B, H); h2 = torch.zeros(B, H); c2 = torch.zeros(B, H)
ratio, losses = 0.9, []
for it in range(4):
    chunk = stream[:, it * T: (it + 1) * T + 1]
    h1, h2, c2 = h1.detach(), h2.detach(), c2.detach()
    inp = chunk[:, 0]
    loss = 0.0
    n_own = 0
    for t in range(T):
        logits, h1, h2, c2 = model.step(inp, h1, h2, c2)
        target = chunk[:, t + 1]
        loss = loss + F.cross_entropy(logits, target)
        probs = F.softmax(logits / 0.8, dim=-1).detach()
        sampled = torch.multinomial(probs, 1).squeeze(1)
        use_gold = torch.rand(B) < ratio
        inp = torch.where(use_gold, target, sampled)
        n_own += int((~use_gold).sum())
    loss = loss / T
    opt.zero_grad(); loss.backward()
    gn = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    ratio *= 0.9
    losses += [loss.detach(), gn, float(n_own)]
report(policy, [model], losses)
