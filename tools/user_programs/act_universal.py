# Untuned: a Universal Transformer encoder with Adaptive Computation Time (Graves; Dehghani et al.)
# on a random sequence-classification task. One shared nn.TransformerEncoderLayer (batch_first,
# norm_first, dropout 0.1) applied again and again; per-token halting as the reference code writes
# it: a halting unit sigmoid(Linear), halting_probability / remainders / n_updates tensors, masks
# still_running, new_halted built by comparisons and .float(), the loop `while ((halting_probability
# < threshold) & (n_updates < max_hops)).byte().any()` (a data-dependent count of iterations, read on
# the host each pass), timing and position signals added each step, the state mixed as
# state * update_weights + previous * (1 - update_weights). The ponder cost (n_updates + remainders)
# added to a cross entropy on the mean-pooled state over non-pad tokens (a key padding mask from
# random lengths). Adam, 3 steps; the number of hops taken logged as a loss entry. (INPLACE=1: the
# accumulators updated in place, halting_probability += ..., previous_state.mul_(1 - w).add_(state * w).)
import math, os, torch, torch.nn as nn, torch.nn.functional as F
from common import setup, report
policy = setup()
torch.use_deterministic_algorithms(True)
B, L, D, H, V, NCLS, MAXHOP, TAU = 16, 96, 128, 4, 500, 10, 8, 0.01
INPLACE = os.environ.get("INPLACE") == "1"
def timing_signal(length, channels, min_ts=1.0, max_ts=1.0e4):
    pos = torch.arange(length).float()
    nts = channels // 2
    inc = math.log(float(max_ts) / float(min_ts)) / max(nts - 1, 1)
    inv = min_ts * torch.exp(torch.arange(nts).float() * -inc)
    st = pos.unsqueeze(1) * inv.unsqueeze(0)
    return torch.cat([torch.sin(st), torch.cos(st)], dim=1).unsqueeze(0)
class ACT(nn.Module):
    def __init__(s):
        super().__init__()
        s.p = nn.Linear(D, 1); s.p.bias.data.fill_(1.0); s.threshold = 1 - 0.1
    def forward(s, state, inputs, fn, time_enc, pos_enc, max_hop, pad_mask):
        halting_probability = torch.zeros(inputs.shape[0], inputs.shape[1])
        remainders = torch.zeros(inputs.shape[0], inputs.shape[1])
        n_updates = torch.zeros(inputs.shape[0], inputs.shape[1])
        previous_state = torch.zeros_like(inputs)
        step = 0
        while ((halting_probability < s.threshold) & (n_updates < max_hop)).byte().any():
            state = state + time_enc[:, :inputs.shape[1], :].type_as(inputs.data)
            state = state + pos_enc[:, step, :].unsqueeze(1).repeat(1, inputs.shape[1], 1).type_as(inputs.data)
            p = torch.sigmoid(s.p(state)).squeeze(-1)
            still_running = (halting_probability < 1.0).float()
            new_halted = (halting_probability + p * still_running > s.threshold).float() * still_running
            still_running = (halting_probability + p * still_running <= s.threshold).float() * still_running
            if INPLACE:
                halting_probability += p * still_running
                remainders += new_halted * (1 - halting_probability)
                halting_probability += new_halted * remainders
                n_updates += still_running + new_halted
            else:
                halting_probability = halting_probability + p * still_running
                remainders = remainders + new_halted * (1 - halting_probability)
                halting_probability = halting_probability + new_halted * remainders
                n_updates = n_updates + still_running + new_halted
            update_weights = p * still_running + new_halted * remainders
            state = fn(state, src_key_padding_mask=pad_mask)
            if INPLACE: previous_state.mul_(1 - update_weights.unsqueeze(-1)).add_(state * update_weights.unsqueeze(-1))
            else: previous_state = (state * update_weights.unsqueeze(-1)) + (previous_state * (1 - update_weights.unsqueeze(-1)))
            step += 1
        return previous_state, (remainders, n_updates), step
class UT(nn.Module):
    def __init__(s):
        super().__init__()
        s.emb = nn.Embedding(V, D, padding_idx=0)
        s.enc = nn.TransformerEncoderLayer(D, H, 4 * D, dropout=0.1, batch_first=True, norm_first=True)
        s.act = ACT()
        s.register_buffer("time_enc", timing_signal(L, D))
        s.register_buffer("pos_enc", timing_signal(MAXHOP, D))
        s.norm = nn.LayerNorm(D); s.out = nn.Linear(D, NCLS)
    def forward(s, tok, pad_mask):
        x = s.emb(tok) * 0.1
        y, (rem, nup), hops = s.act(x, x, s.enc, s.time_enc, s.pos_enc, MAXHOP, pad_mask)
        y = s.norm(y)
        keep = (~pad_mask).float().unsqueeze(-1)
        pooled = (y * keep).sum(1) / keep.sum(1)
        ponder = ((rem + nup) * (~pad_mask).float()).sum() / keep.sum()
        return s.out(pooled), ponder, hops
model = UT()
opt = torch.optim.Adam(model.parameters(), lr=5e-4)
g = torch.Generator().manual_seed(1)
losses = []
for step in range(3):
    lens = torch.randint(L // 2, L + 1, (B,), generator=g)
    pad = torch.arange(L)[None, :] >= lens[:, None]
    tok = torch.randint(1, V, (B, L), generator=g).masked_fill(pad, 0)
    y = (tok * (~pad)).sum(1) % NCLS
    logits, ponder, hops = model(tok, pad)
    loss = F.cross_entropy(logits, y) + TAU * ponder
    opt.zero_grad()
    loss.backward()
    opt.step()
    losses += [loss.detach(), torch.tensor(float(hops))]
report(policy, [model], losses)
