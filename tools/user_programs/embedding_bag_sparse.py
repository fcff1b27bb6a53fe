# Untuned: a recommender with a wide sparse part and a dense tower. nn.EmbeddingBag(mode="sum",
# sparse=True) over flat ids with offsets and per_sample_weights (bags of different sizes, some
# empty), a second bag table (mode="mean", sparse=True, padding_idx=0) fed a 2-D padded input,
# F.embedding with padding_idx on a sparse=True weight Parameter, all three optimized by
# torch.optim.SparseAdam; the dense tower (an MLP over the concatenated features, cross terms by
# bmm) optimized by Adagrad. Five steps.
import torch, torch.nn as nn, torch.nn.functional as F
from common import setup, report
policy = setup()
torch.use_deterministic_algorithms(True)
B, NID, D = 4096, 2000, 32
class Model(nn.Module):
    def __init__(s):
        super().__init__()
        s.bag = nn.EmbeddingBag(NID, D, mode="sum", sparse=True)
        s.bag2 = nn.EmbeddingBag(NID, D, mode="mean", sparse=True, padding_idx=0)
        s.hist = nn.Parameter(torch.randn(NID, D) * 0.1)
        s.dense_in = nn.Linear(13, D)
        s.tower = nn.Sequential(nn.Linear(4 * D + 6, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 256), nn.ReLU(),
                                nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 1))
    def forward(s, ids, offsets, psw, ids2, hist_ids, dense):
        e1 = s.bag(ids, offsets, per_sample_weights=psw)
        e2 = s.bag2(ids2)
        e3 = F.embedding(hist_ids, s.hist, padding_idx=0, sparse=True)       # B x L x D
        e3 = e3.sum(1) / (hist_ids != 0).sum(1, keepdim=True).clamp(min=1)
        d = F.relu(s.dense_in(dense))
        feats = torch.stack([e1, e2, e3, d], 1)                              # B x 4 x D
        inter = torch.bmm(feats, feats.transpose(1, 2))
        iu = torch.triu_indices(4, 4, 1)
        x = torch.cat([feats.flatten(1), inter[:, iu[0], iu[1]]], 1)
        return s.tower(x).squeeze(1)
model = Model()
sparse_params = [model.bag.weight, model.bag2.weight, model.hist]
dense_params = [p for n, p in model.named_parameters() if not any(p is q for q in sparse_params)]
opt_s = torch.optim.SparseAdam(sparse_params, lr=1e-2)
opt_d = torch.optim.Adagrad(dense_params, lr=1e-2, lr_decay=1e-3, weight_decay=1e-4)
g = torch.Generator().manual_seed(1)
losses = []
for step in range(5):
    sizes = torch.randint(0, 8, (B,), generator=g)                         # some bags empty
    ids = torch.randint(0, NID, (int(sizes.sum()),), generator=g)
    offsets = torch.cat([torch.zeros(1, dtype=torch.long), sizes.cumsum(0)[:-1]])
    psw = torch.rand(ids.shape, generator=g)
    ids2 = torch.randint(0, NID, (B, 6), generator=g); ids2[:, 4:] = 0
    hist_ids = torch.randint(0, NID, (B, 5), generator=g)
    hist_ids[torch.rand(B, 5, generator=g) < 0.3] = 0
    dense = torch.randn(B, 13, generator=g)
    y = (torch.rand(B, generator=g) < 0.3).float()
    out = model(ids, offsets, psw, ids2, hist_ids, dense)
    loss = F.binary_cross_entropy_with_logits(out, y)
    opt_s.zero_grad(); opt_d.zero_grad()
    loss.backward()
    opt_s.step(); opt_d.step()
    losses.append(loss.detach())
report(policy, [model], losses)
