# Untuned: a Tacotron-2-style spectrogram predictor on synthetic text/mel pairs. Encoder: an
# nn.Embedding, three Conv1d+BatchNorm+ReLU layers with dropout, a BiLSTM over padded text. Decoder,
# unrolled by hand for 50 frames with teacher forcing: a prenet whose dropout is always on
# (F.dropout(x, 0.5, training=True), as in the paper, also in eval), an attention LSTMCell,
# location-sensitive attention (a Conv1d over the previous and the cumulative attention weights
# stacked, a dense layer, energies added to the processed query and memory, tanh, a score, a
# padding mask by masked_fill, softmax), the cumulative weights carried by an out-of-place add, a
# decoder LSTMCell with dropout on its hidden state, a mel projection and a stop-token logit.
# A 5-layer Conv1d+BatchNorm+tanh postnet with a residual; losses: MSE and L1 on the mels before and
# after the postnet, masked past each utterance's length, and a stop-token BCE with logits.
# Adam with weight decay, clip_grad_norm_, 3 steps. BATCH=N: another batch size (32).
import os, torch, torch.nn as nn, torch.nn.functional as F
from common import setup, report
policy = setup()
V, E, TX, NM, TY, AR, DR, AD, PRE = 48, 128, 60, 40, 50, 256, 256, 64, 128
B = int(os.environ.get("BATCH", 32))
class Encoder(nn.Module):
    def __init__(s):
        super().__init__()
        s.emb = nn.Embedding(V, E, padding_idx=0)
        s.convs = nn.ModuleList(nn.Sequential(nn.Conv1d(E, E, 5, padding=2), nn.BatchNorm1d(E)) for _ in range(3))
        s.lstm = nn.LSTM(E, E // 2, batch_first=True, bidirectional=True)
    def forward(s, text, lens):
        x = s.emb(text).transpose(1, 2)
        for c in s.convs:
            x = F.dropout(F.relu(c(x)), 0.5, s.training)
        packed = nn.utils.rnn.pack_padded_sequence(x.transpose(1, 2), lens, batch_first=True, enforce_sorted=False)
        out, _ = s.lstm(packed)
        out, _ = nn.utils.rnn.pad_packed_sequence(out, batch_first=True, total_length=TX)
        return out
class LocationAttention(nn.Module):
    def __init__(s):
        super().__init__()
        s.q = nn.Linear(AR, AD, bias=False); s.m = nn.Linear(E, AD, bias=False)
        s.loc_conv = nn.Conv1d(2, 32, 31, padding=15, bias=False); s.loc = nn.Linear(32, AD, bias=False)
        s.v = nn.Linear(AD, 1, bias=True)
    def forward(s, query, memory, pmem, w_prev, w_cum, mask):
        loc = s.loc(s.loc_conv(torch.stack([w_prev, w_cum], 1)).transpose(1, 2))
        e = s.v(torch.tanh(s.q(query)[:, None] + pmem + loc)).squeeze(-1)
        e = e.masked_fill(mask, float("-inf"))
        w = F.softmax(e, -1)
        ctx = torch.bmm(w[:, None], memory).squeeze(1)
        return ctx, w
class Decoder(nn.Module):
    def __init__(s):
        super().__init__()
        s.pre1 = nn.Linear(NM, PRE); s.pre2 = nn.Linear(PRE, PRE)
        s.att_rnn = nn.LSTMCell(PRE + E, AR)
        s.att = LocationAttention()
        s.dec_rnn = nn.LSTMCell(AR + E, DR)
        s.proj = nn.Linear(DR + E, NM); s.gate = nn.Linear(DR + E, 1)
    def prenet(s, x):
        x = F.dropout(F.relu(s.pre1(x)), 0.5, training=True)
        return F.dropout(F.relu(s.pre2(x)), 0.5, training=True)
    def forward(s, memory, mask, mels):
        b = memory.shape[0]
        go = torch.zeros(b, 1, NM)
        pre = s.prenet(torch.cat([go, mels[:, :-1]], 1))          # teacher forcing, all frames at once
        pmem = s.att.m(memory)
        ah, ac = torch.zeros(b, AR), torch.zeros(b, AR)
        dh, dc = torch.zeros(b, DR), torch.zeros(b, DR)
        ctx = torch.zeros(b, E)
        w, w_cum = torch.zeros(b, TX), torch.zeros(b, TX)
        outs, gates, aligns = [], [], []
        for t in range(TY):
            ah, ac = s.att_rnn(torch.cat([pre[:, t], ctx], -1), (ah, ac))
            ah = F.dropout(ah, 0.1, s.training)
            ctx, w = s.att(ah, memory, pmem, w, w_cum, mask)
            w_cum = w_cum + w
            dh, dc = s.dec_rnn(torch.cat([ah, ctx], -1), (dh, dc))
            dh = F.dropout(dh, 0.1, s.training)
            hc = torch.cat([dh, ctx], -1)
            outs.append(s.proj(hc)); gates.append(s.gate(hc).squeeze(-1)); aligns.append(w)
        return torch.stack(outs, 1), torch.stack(gates, 1), torch.stack(aligns, 1)
class Postnet(nn.Module):
    def __init__(s):
        super().__init__()
        ch = [NM, 256, 256, 256, 256, NM]
        s.layers = nn.ModuleList(nn.Sequential(nn.Conv1d(ch[i], ch[i + 1], 5, padding=2), nn.BatchNorm1d(ch[i + 1])) for i in range(5))
    def forward(s, x):
        for i, l in enumerate(s.layers):
            x = l(x)
            if i < 4: x = torch.tanh(x)
            x = F.dropout(x, 0.5, s.training)
        return x
class Tacotron(nn.Module):
    def __init__(s):
        super().__init__()
        s.enc, s.dec, s.post = Encoder(), Decoder(), Postnet()
    def forward(s, text, tlens, mels):
        memory = s.enc(text, tlens)
        mask = torch.arange(TX)[None] >= tlens[:, None]
        mel, gate, align = s.dec(memory, mask, mels)
        post = mel + s.post(mel.transpose(1, 2)).transpose(1, 2)
        return mel, post, gate, align
g = torch.Generator().manual_seed(13)
table = torch.randn(V, NM, generator=g)      # each symbol's "sound"
def batch():
    tlens = torch.randint(TX // 2, TX + 1, (B,), generator=g)
    text = torch.randint(1, V, (B, TX), generator=g) * (torch.arange(TX)[None] < tlens[:, None])
    mlens = torch.randint(TY // 2, TY + 1, (B,), generator=g)
    pos = (torch.arange(TY)[None].float() / mlens[:, None] * tlens[:, None]).long().clamp(max=TX - 1)
    mels = table[torch.gather(text, 1, pos)] + 0.1 * torch.randn(B, TY, NM, generator=g)
    fmask = (torch.arange(TY)[None] < mlens[:, None]).float()
    mels = mels * fmask[..., None]
    stop = (torch.arange(TY)[None] >= (mlens[:, None] - 1)).float()
    return text, tlens, mels, fmask, stop
model = Tacotron()
opt = torch.optim.Adam(model.parameters(), lr=1e-3, weight_decay=1e-6, eps=1e-6)
losses = []
for step in range(3):
    text, tlens, mels, fmask, stop = batch()
    mel, post, gate, align = model(text, tlens, mels)
    m = fmask[..., None]; n = m.sum() * NM
    mse = (((mel - mels) ** 2 * m).sum() + ((post - mels) ** 2 * m).sum()) / n
    l1 = (((mel - mels).abs() * m).sum() + ((post - mels).abs() * m).sum()) / n
    gate_loss = F.binary_cross_entropy_with_logits(gate, stop)
    loss = mse + l1 + gate_loss
    opt.zero_grad()
    loss.backward()
    gn = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    losses += [mse.detach(), l1.detach(), gate_loss.detach(), gn, align.detach().max(-1).values.mean()]
report(policy, [model], losses)
