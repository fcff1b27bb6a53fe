# Untuned: a BiLSTM-CRF tagger (Lample et al.) on random padded sentences, as the PyTorch tutorial
# and its batched descendants write it. Word embeddings concatenated with a character-level
# representation (a char Conv1d + max over characters), nn.LSTM(bidirectional=True, batch_first)
# over pack_padded_sequence (enforce_sorted=False) and pad_packed_sequence, dropout, a Linear to
# emission scores. The CRF: a transitions nn.Parameter with start/stop tags; the partition function by
# the forward algorithm in a Python loop over time, each step a broadcast (B, K, 1) + (K, K) +
# (B, 1, K), torch.logsumexp over the previous tag and torch.where on the step's mask (many small
# tensors); the gold path score by gather over emissions and indexing of transitions. Negative
# log-likelihood summed over the batch, SGD with momentum and clip_grad_value_, 3 steps; then Viterbi
# decoding under no_grad (max/argmax per step, back-pointers in a list, a reverse loop) and the token
# accuracy of the decoded tags.
import torch, torch.nn as nn, torch.nn.functional as F
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence
from common import setup, report
policy = setup()
torch.use_deterministic_algorithms(True)
B, L, WV, CV, WL, WD, CD, HID, NTAG = 128, 60, 1000, 60, 8, 64, 24, 128, 9
START, STOP, K = NTAG, NTAG + 1, NTAG + 2
class CRF(nn.Module):
    def __init__(s):
        super().__init__()
        s.transitions = nn.Parameter(torch.randn(K, K) * 0.1)            # [to, from]
        s.transitions.data[START, :] = -10000.0
        s.transitions.data[:, STOP] = -10000.0
    def partition(s, feats, mask):                                       # feats (B, L, K)
        alpha = torch.full((feats.shape[0], K), -10000.0)
        alpha[:, START] = 0.0
        for t in range(feats.shape[1]):
            scores = alpha.unsqueeze(1) + s.transitions.unsqueeze(0) + feats[:, t].unsqueeze(2)   # (B, to, from)
            nxt = torch.logsumexp(scores, dim=2)
            alpha = torch.where(mask[:, t].unsqueeze(1), nxt, alpha)
        return torch.logsumexp(alpha + s.transitions[STOP].unsqueeze(0), dim=1)
    def gold(s, feats, tags, mask):
        b = feats.shape[0]
        emit = feats.gather(2, tags.unsqueeze(2)).squeeze(2)
        prev = torch.cat([torch.full((b, 1), START, dtype=torch.long), tags[:, :-1]], 1)
        trans = s.transitions[tags, prev]
        score = ((emit + trans) * mask.float()).sum(1)
        last = tags.gather(1, (mask.sum(1) - 1).unsqueeze(1)).squeeze(1)
        return score + s.transitions[STOP, last]
    @torch.no_grad()
    def viterbi(s, feats, mask):
        b = feats.shape[0]
        v = torch.full((b, K), -10000.0); v[:, START] = 0
        ptrs = []
        for t in range(feats.shape[1]):
            sc = v.unsqueeze(1) + s.transitions.unsqueeze(0)
            best, arg = sc.max(2)
            nv = best + feats[:, t]
            m = mask[:, t].unsqueeze(1)
            v = torch.where(m, nv, v)
            ptrs.append(torch.where(m, arg, torch.arange(K).expand(b, K)))
        v = v + s.transitions[STOP].unsqueeze(0)
        last = v.argmax(1)
        path = [last]
        for p in reversed(ptrs[1:]):
            last = p.gather(1, last.unsqueeze(1)).squeeze(1)
            path.append(last)
        return torch.stack(path[::-1], 1)
class Tagger(nn.Module):
    def __init__(s):
        super().__init__()
        s.wemb = nn.Embedding(WV, WD, padding_idx=0); s.cemb = nn.Embedding(CV, CD, padding_idx=0)
        s.cconv = nn.Conv1d(CD, CD, 3, padding=1)
        s.lstm = nn.LSTM(WD + CD, HID, num_layers=2, bidirectional=True, batch_first=True, dropout=0.2)
        s.drop = nn.Dropout(0.5); s.proj = nn.Linear(2 * HID, K); s.crf = CRF()
    def features(s, words, chars, lens):
        b, l = words.shape
        c = s.cemb(chars.view(b * l, WL)).transpose(1, 2)
        c = F.relu(s.cconv(c)).max(2).values.view(b, l, CD)
        x = s.drop(torch.cat([s.wemb(words), c], -1))
        packed = pack_padded_sequence(x, lens, batch_first=True, enforce_sorted=False)
        out, _ = s.lstm(packed)
        out, _ = pad_packed_sequence(out, batch_first=True, total_length=l)
        return s.proj(s.drop(out))
    def nll(s, words, chars, lens, tags, mask):
        f = s.features(words, chars, lens)
        return (s.crf.partition(f, mask) - s.crf.gold(f, tags, mask)).sum()
model = Tagger()
opt = torch.optim.SGD(model.parameters(), lr=0.005, momentum=0.9)
g = torch.Generator().manual_seed(1)
losses = []
for step in range(3):
    lens = torch.randint(L // 3, L + 1, (B,), generator=g)
    mask = torch.arange(L)[None, :] < lens[:, None]
    words = torch.randint(1, WV, (B, L), generator=g) * mask
    chars = torch.randint(1, CV, (B, L, WL), generator=g) * mask.unsqueeze(-1)
    tags = ((words % NTAG) * mask)
    loss = model.nll(words, chars, lens, tags, mask)
    opt.zero_grad()
    loss.backward()
    torch.nn.utils.clip_grad_value_(model.parameters(), 5.0)
    opt.step()
    losses.append(loss.detach())
model.eval()
pred = model.crf.viterbi(model.features(words, chars, lens).detach(), mask)
losses.append(((pred == tags) & mask).sum().float() / mask.sum())
report(policy, [model], losses)
