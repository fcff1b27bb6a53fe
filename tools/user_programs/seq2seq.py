"""A seq2seq LSTM with LSTMCell decoding loop, Bahdanau attention over encoder states, teacher
forcing, packed encoder input, gradient clipping by value, Adagrad."""
from common import *
from torch import nn
from torch.nn import functional as F
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence
policy = setup()
class S2S(nn.Module):
    def __init__(s, V=300, d=128):
        super().__init__()
        s.emb = nn.Embedding(V, d, padding_idx=0); s.enc = nn.LSTM(d, d, batch_first=True, bidirectional=True)
        s.bridge = nn.Linear(2 * d, d); s.cell = nn.LSTMCell(d + 2 * d, d); s.wq = nn.Linear(d, d, bias=False); s.wk = nn.Linear(2 * d, d, bias=False); s.v = nn.Linear(d, 1, bias=False); s.out = nn.Linear(d, V)
    def forward(s, src, lens, tgt):
        packed = pack_padded_sequence(s.emb(src), lens, batch_first=True, enforce_sorted=False)
        enc, _ = s.enc(packed); enc, _ = pad_packed_sequence(enc, batch_first=True)
        mask = torch.arange(enc.size(1))[None] < lens[:, None]
        h = torch.tanh(s.bridge(enc.sum(1) / lens[:, None])); c = torch.zeros_like(h); keys = s.wk(enc); outs = []
        for t in range(tgt.size(1)):
            sc = s.v(torch.tanh(keys + s.wq(h)[:, None])).squeeze(-1).masked_fill(~mask, -1e9)
            ctx = (F.softmax(sc, -1)[..., None] * enc).sum(1)
            h, c = s.cell(torch.cat([s.emb(tgt[:, t]), ctx], -1), (h, c)); outs.append(s.out(h))
        return torch.stack(outs, 1)
m = S2S(); opt = torch.optim.Adagrad(m.parameters(), 0.05)
g = torch.Generator().manual_seed(1); losses = []
for step in range(3):
    lens = torch.randint(10, 41, (48,), generator=g); src = torch.randint(1, 300, (48, 40), generator=g) * (torch.arange(40)[None] < lens[:, None])
    tgt = torch.randint(1, 300, (48, 21), generator=g)
    loss = F.cross_entropy(m(src, lens, tgt[:, :-1]).reshape(-1, 300), tgt[:, 1:].reshape(-1))
    opt.zero_grad(); loss.backward(); torch.nn.utils.clip_grad_value_(m.parameters(), 0.5); opt.step(); losses.append(loss.item())
report(policy, [m], losses)
