# Untuned: a speech-style recurrent tagger. nn.LSTM with proj_size (LSTMP), bidirectional,
# num_layers=3 and dropout=0.2 between layers, over `pack_sequence(enforce_sorted=False)` of
# variable-length utterances (a list of tensors, unsorted); `pad_packed_sequence` back to a padded
# batch, the packed batch's `sorted_indices`/`unsorted_indices` round trip checked; then an
# nn.RNN(nonlinearity="relu") head over `pack_padded_sequence` of the projected outputs and the
# final hidden states (h_n of both) feeding an utterance classifier. Frame loss masked by length,
# clip_grad_norm_, RMSprop, five steps.
import torch, torch.nn as nn, torch.nn.functional as F
from torch.nn.utils.rnn import pack_sequence, pad_packed_sequence, pack_padded_sequence
from common import setup, report
policy = setup()
torch.use_deterministic_algorithms(True)
NB, TMAX, FEAT, H, P, NC, NU = 48, 72, 40, 160, 64, 12, 6
class Tagger(nn.Module):
    def __init__(s):
        super().__init__()
        s.lstm = nn.LSTM(FEAT, H, num_layers=3, bidirectional=True, proj_size=P, dropout=0.2, batch_first=True)
        s.rnn = nn.RNN(2 * P, 96, nonlinearity="relu", num_layers=2, batch_first=True)
        s.frame = nn.Linear(96, NC); s.utt = nn.Linear(2 * P * 3 + 96 * 2, NU)
    def forward(s, seqs):
        packed = pack_sequence(seqs, enforce_sorted=False)
        out, (hn, cn) = s.lstm(packed)                             # hn: 6 x B x P, cn: 6 x B x H
        pad, lens = pad_packed_sequence(out, batch_first=True)     # B x T x 2P, original order
        r_in = pack_padded_sequence(F.layer_norm(pad, (2 * P,)), lens, batch_first=True, enforce_sorted=False)
        r_out, r_h = s.rnn(r_in)
        r_pad, _ = pad_packed_sequence(r_out, batch_first=True, total_length=pad.shape[1])
        utt = torch.cat([hn.transpose(0, 1).reshape(len(seqs), -1), r_h.transpose(0, 1).reshape(len(seqs), -1)], -1)
        return s.frame(r_pad), s.utt(utt), lens, packed
model = Tagger()
opt = torch.optim.RMSprop(model.parameters(), lr=1e-3, alpha=0.95)
g = torch.Generator().manual_seed(1)
losses = []
for step in range(5):
    lens = torch.randint(TMAX // 4, TMAX + 1, (NB,), generator=g).tolist()
    seqs = [torch.randn(n, FEAT, generator=g) for n in lens]
    tags = torch.randint(0, NC, (NB, TMAX), generator=g)
    uy = torch.randint(0, NU, (NB,), generator=g)
    frames, ulog, L, packed = model(seqs)
    assert torch.equal(packed.sorted_indices[packed.unsorted_indices], torch.arange(NB))
    T = frames.shape[1]
    mask = torch.arange(T)[None, :] < L[:, None]
    fl = F.cross_entropy(frames[mask], tags[:, :T][mask])
    loss = fl + F.cross_entropy(ulog, uy)
    opt.zero_grad(); loss.backward()
    gn = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    losses += [loss.detach(), fl.detach(), gn]
report(policy, [model], losses)
