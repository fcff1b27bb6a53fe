# Untuned: a speech-style tagger on variable-length sequences. Utterances are a Python list of
# token tensors of random lengths, batched with pad_sequence (padding 0) into an nn.Embedding with
# padding_idx=0, packed with pack_padded_sequence(enforce_sorted=False, lengths on the CPU), a
# 2-layer bidirectional LSTM (dropout between layers), pad_packed_sequence(total_length=T) back, a
# second packed bidirectional GRU over the LSTM's padded output re-packed, then two heads: CTC on
# log_softmax (T, B, C) with per-utterance input and target lengths (blank 0, zero_infinity) and a
# frame-level cross-entropy against per-frame labels with ignore_index=-100 on the padding and
# label_smoothing. Gradients clipped with clip_grad_norm_(foreach=True) (its returned norm
# logged); AdamW, 4 steps.
import torch, torch.nn as nn, torch.nn.functional as F
from torch.nn.utils.rnn import pad_sequence, pack_padded_sequence, pad_packed_sequence
from common import setup, report
policy = setup()
torch.use_deterministic_algorithms(True)
B, T, V, D, H, C = 24, 96, 64, 96, 128, 20
class Tagger(nn.Module):
    def __init__(s):
        super().__init__()
        s.emb = nn.Embedding(V, D, padding_idx=0)
        s.lstm = nn.LSTM(D, H, num_layers=2, bidirectional=True, batch_first=True, dropout=0.2)
        s.gru = nn.GRU(2 * H, H, bidirectional=True, batch_first=True)
        s.ctc_head = nn.Linear(2 * H, C); s.frame_head = nn.Linear(2 * H, C)
    def forward(s, toks, lengths):
        e = F.dropout(s.emb(toks), 0.1, s.training)
        packed = pack_padded_sequence(e, lengths, batch_first=True, enforce_sorted=False)
        out, (h, c) = s.lstm(packed)
        out, out_len = pad_packed_sequence(out, batch_first=True, total_length=toks.shape[1])
        out2, _ = s.gru(pack_padded_sequence(out, out_len, batch_first=True, enforce_sorted=False))
        out2, _ = pad_packed_sequence(out2, batch_first=True, total_length=toks.shape[1])
        z = out + out2
        return s.ctc_head(z), s.frame_head(z), h
model = Tagger()
opt = torch.optim.AdamW(model.parameters(), lr=2e-3)
g = torch.Generator().manual_seed(1)
losses = []
for step in range(4):
    lengths = torch.randint(T // 3, T + 1, (B,), generator=g); lengths[3] = T
    utts = [torch.randint(1, V, (int(n),), generator=g) for n in lengths]
    toks = pad_sequence(utts, batch_first=True, padding_value=0)
    frames = pad_sequence([torch.randint(0, C, (int(n),), generator=g) for n in lengths], batch_first=True, padding_value=-100)
    tlen = torch.clamp(lengths // 4, min=1)
    targets = torch.cat([torch.randint(1, C, (int(n),), generator=g) for n in tlen])
    ctc_logits, frame_logits, h = model(toks, lengths)
    lp = ctc_logits.log_softmax(-1).transpose(0, 1)                     # (T, B, C)
    l_ctc = F.ctc_loss(lp, targets, lengths, tlen, blank=0, zero_infinity=True)
    l_ce = F.cross_entropy(frame_logits.reshape(-1, C), frames.reshape(-1), ignore_index=-100, label_smoothing=0.1)
    loss = l_ctc + l_ce
    opt.zero_grad()
    loss.backward()
    gn = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0, foreach=True)
    opt.step()
    losses += [l_ctc.detach(), l_ce.detach(), gn, h.detach().square().sum()]
report(policy, [model], losses)
