# Untuned: PyTorch's classic word_language_model (Embedding -> 2-layer LSTM, dropout -> tied Linear decoder),
# truncated BPTT (bptt=35) over a long token stream, hidden state repackaged (detached) across chunks
# and across optimizer updates, clip_grad_norm_, manual SGD update p.data.add_(p.grad, alpha=-lr).
import torch, torch.nn as nn, torch.nn.functional as F
from common import setup, report
policy = setup()
torch.use_deterministic_algorithms(True)
ntoken, ninp, nhid, nlayers, bsz, bptt, lr, clip = 2000, 200, 200, 2, 20, 35, 20.0, 0.25
class RNNModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.drop = nn.Dropout(0.2)
        self.encoder = nn.Embedding(ntoken, ninp)
        self.rnn = nn.LSTM(ninp, nhid, nlayers, dropout=0.2)
        self.decoder = nn.Linear(nhid, ntoken)
        self.decoder.weight = self.encoder.weight  # tie weights
        initrange = 0.1
        nn.init.uniform_(self.encoder.weight, -initrange, initrange)
        nn.init.zeros_(self.decoder.bias)
    def forward(self, input, hidden):
        emb = self.drop(self.encoder(input))
        output, hidden = self.rnn(emb, hidden)
        output = self.drop(output)
        decoded = self.decoder(output).view(-1, ntoken)
        return F.log_softmax(decoded, dim=1), hidden
    def init_hidden(self, bsz):
        weight = next(self.parameters())
        return (weight.new_zeros(nlayers, bsz, nhid), weight.new_zeros(nlayers, bsz, nhid))
def repackage_hidden(h):
    if isinstance(h, torch.Tensor): return h.detach()
    return tuple(repackage_hidden(v) for v in h)
def batchify(data, bsz):
    nbatch = data.size(0) // bsz
    return data.narrow(0, 0, nbatch * bsz).view(bsz, -1).t().contiguous()
def get_batch(source, i):
    seq_len = min(bptt, len(source) - 1 - i)
    return source[i:i + seq_len], source[i + 1:i + 1 + seq_len].reshape(-1)
g = torch.Generator().manual_seed(1)
stream = torch.randint(0, ntoken, (bsz * (bptt * 12 + 1),), generator=g)
train_data = batchify(stream, bsz)
model = RNNModel()
criterion = nn.NLLLoss()
model.train()
hidden = model.init_hidden(bsz)
losses = []
i = 0
for step in range(4):
    for chunk in range(3):
        data, targets = get_batch(train_data, i); i += bptt
        model.zero_grad()
        hidden = repackage_hidden(hidden)
        output, hidden = model(data, hidden)
        loss = criterion(output, targets)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        for p in model.parameters():
            p.data.add_(p.grad, alpha=-lr)
        losses.append(loss.detach())
    lr /= 1.5
report(policy, [model], losses)
