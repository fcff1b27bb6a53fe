# Untuned: a pointer-generator summariser (See et al.) with coverage. A BiLSTM encoder over
# padded sources (lengths by a mask), an LSTMCell decoder unrolled 24 steps with teacher
# forcing, additive attention with a coverage vector fed back, a generation probability by
# sigmoid, the copy distribution added into an extended vocabulary by scatter_add (source
# words outside the vocabulary get ids above it), target probabilities by gather, a coverage
# loss summed over steps, and label positions past each summary's end masked out.
# Adagrad (as the paper), gradient clipping, 3 steps.
import torch, torch.nn as nn, torch.nn.functional as F
from common import setup, report
policy = setup()
V, OOV, E, H, B, TS, TD = 400, 40, 64, 96, 8, 60, 24
class PG(nn.Module):
    def __init__(s):
        super().__init__()
        s.emb = nn.Embedding(V, E, padding_idx=0)
        s.enc = nn.LSTM(E, H, batch_first=True, bidirectional=True)
        s.reduce_h = nn.Linear(2 * H, H); s.reduce_c = nn.Linear(2 * H, H)
        s.cell = nn.LSTMCell(E + 2 * H, H)
        s.W_h = nn.Linear(2 * H, 2 * H, bias=False); s.W_s = nn.Linear(H, 2 * H); s.w_c = nn.Linear(1, 2 * H, bias=False)
        s.v = nn.Linear(2 * H, 1, bias=False)
        s.out1 = nn.Linear(3 * H, H); s.out2 = nn.Linear(H, V)
        s.p_gen = nn.Linear(4 * H + E, 1)
    def forward(s, src, src_ext, src_mask, tgt_in, tgt_out, tgt_mask):
        enc, (h, c) = s.enc(s.emb(src))
        feats = s.W_h(enc)
        state = (torch.relu(s.reduce_h(torch.cat([h[0], h[1]], -1))), torch.relu(s.reduce_c(torch.cat([c[0], c[1]], -1))))
        ctx = torch.zeros(B, 2 * H); coverage = torch.zeros(B, TS)
        nll, cov_loss = [], []
        for t in range(TD):
            x = s.emb(tgt_in[:, t])
            state = s.cell(torch.cat([x, ctx], -1), state)
            e = s.v(torch.tanh(feats + s.W_s(state[0])[:, None] + s.w_c(coverage[..., None]))).squeeze(-1)
            e = e.masked_fill(~src_mask, float("-inf"))
            attn = e.softmax(-1)
            ctx = torch.bmm(attn[:, None], enc).squeeze(1)
            vocab = s.out2(s.out1(torch.cat([state[0], ctx], -1))).softmax(-1)
            pg = torch.sigmoid(s.p_gen(torch.cat([ctx, state[0], state[1], x], -1)))
            ext = torch.cat([pg * vocab, torch.zeros(B, OOV)], -1)
            ext = ext.scatter_add(1, src_ext, (1 - pg) * attn)
            p = ext.gather(1, tgt_out[:, t:t + 1]).squeeze(1)
            nll.append(-torch.log(p + 1e-12) * tgt_mask[:, t])
            cov_loss.append(torch.minimum(attn, coverage).sum(-1) * tgt_mask[:, t])
            coverage = coverage + attn
        n = tgt_mask.sum()
        return torch.stack(nll, 1).sum() / n, torch.stack(cov_loss, 1).sum() / n
model = PG()
opt = torch.optim.Adagrad(model.parameters(), lr=0.15, initial_accumulator_value=0.1)
g = torch.Generator().manual_seed(7)
losses = []
for step in range(3):
    src_ext = torch.randint(1, V + OOV, (B, TS), generator=g)
    lens = torch.randint(TS // 2, TS + 1, (B,), generator=g)
    src_mask = torch.arange(TS)[None] < lens[:, None]
    src_ext = src_ext * src_mask
    src = torch.where(src_ext >= V, torch.ones_like(src_ext), src_ext)   # OOV -> UNK (1)
    pick = torch.randint(0, TS // 2, (B, TD), generator=g)
    tgt_out = torch.gather(src_ext, 1, pick).clamp(min=2)
    tgt_in = torch.cat([torch.full((B, 1), 2), torch.where(tgt_out >= V, torch.ones_like(tgt_out), tgt_out)[:, :-1]], 1)
    tlen = torch.randint(TD // 2, TD + 1, (B,), generator=g)
    tgt_mask = (torch.arange(TD)[None] < tlen[:, None]).float()
    nll, cov = model(src, src_ext, src_mask, tgt_in, tgt_out, tgt_mask)
    loss = nll + 1.0 * cov
    opt.zero_grad()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 2.0)
    opt.step()
    losses += [nll.detach(), cov.detach()]
report(policy, [model], losses)
