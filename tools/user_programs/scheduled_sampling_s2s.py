# Untuned: a GRU encoder-decoder with Bahdanau (additive) attention trained with scheduled
# sampling: at each decoder step the next input token is the gold token or the argmax of the
# previous prediction, chosen per example by torch.rand < teacher-forcing ratio (torch.where), the
# embedding looked up from the chosen token tensor; label-smoothed NLL written by hand (log_softmax,
# gather, mean over the vocabulary), clip_grad_norm_, and the teacher-forcing ratio decayed each step.
import torch, torch.nn as nn, torch.nn.functional as F
from common import setup, report
policy = setup()
torch.use_deterministic_algorithms(True)
SV, TV, E, Hd, B, S, T, BOS = 200, 180, 64, 96, 64, 24, 20, 1
class Encoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(SV, E)
        self.rnn = nn.GRU(E, Hd, batch_first=True, bidirectional=True)
        self.fc = nn.Linear(2 * Hd, Hd)
    def forward(self, src):
        out, h = self.rnn(self.emb(src))
        return out, torch.tanh(self.fc(torch.cat([h[-2], h[-1]], 1)))
class Attention(nn.Module):
    def __init__(self):
        super().__init__()
        self.W, self.U, self.v = nn.Linear(Hd, Hd, bias=False), nn.Linear(2 * Hd, Hd), nn.Linear(Hd, 1, bias=False)
    def forward(self, h, enc, enc_proj):
        e = self.v(torch.tanh(self.W(h).unsqueeze(1) + enc_proj)).squeeze(2)
        a = F.softmax(e, dim=1)
        return torch.bmm(a.unsqueeze(1), enc).squeeze(1), a
class Decoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(TV, E)
        self.att = Attention()
        self.cell = nn.GRUCell(E + 2 * Hd, Hd)
        self.out = nn.Linear(Hd + 2 * Hd + E, TV)
        self.drop = nn.Dropout(0.1)
    def step(self, tok, h, enc, enc_proj):
        x = self.drop(self.emb(tok))
        ctx, a = self.att(h, enc, enc_proj)
        h = self.cell(torch.cat([x, ctx], 1), h)
        return self.out(torch.cat([h, ctx, x], 1)), h, a
class Seq2Seq(nn.Module):
    def __init__(self):
        super().__init__()
        self.enc, self.dec = Encoder(), Decoder()
    def forward(self, src, tgt, tf_ratio, gen):
        enc, h = self.enc(src)
        enc_proj = self.dec.att.U(enc)
        tok = torch.full((src.size(0),), BOS, dtype=torch.long)
        logits, atts = [], []
        for t in range(tgt.size(1)):
            out, h, a = self.dec.step(tok, h, enc, enc_proj)
            logits.append(out); atts.append(a)
            pred = out.argmax(1)
            use_gold = torch.rand(src.size(0), generator=gen) < tf_ratio
            tok = torch.where(use_gold, tgt[:, t], pred)
        return torch.stack(logits, 1), torch.stack(atts, 1)
def smoothed_nll(logits, target, eps=0.1):
    lp = F.log_softmax(logits, dim=-1)
    nll = -lp.gather(-1, target.unsqueeze(-1)).squeeze(-1)
    smooth = -lp.mean(dim=-1)
    return ((1 - eps) * nll + eps * smooth).mean()
g = torch.Generator().manual_seed(1)
ss_gen = torch.Generator().manual_seed(2)
model = Seq2Seq()
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
tf_ratio, losses = 1.0, []
for step in range(4):
    src = torch.randint(2, SV, (B, S), generator=g)
    tgt = (src[:, :T] * 7 + 3) % TV  # a learnable mapping
    logits, atts = model(src, tgt, tf_ratio, ss_gen)
    loss = smoothed_nll(logits, tgt)
    opt.zero_grad()
    loss.backward()
    gn = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    losses += [loss.detach(), gn, atts.detach().max(-1).values.mean()]
    tf_ratio *= 0.7
report(policy, [model], losses)
