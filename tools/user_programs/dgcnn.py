# Untuned: DGCNN point-cloud classifier. Pairwise distances, topk k-NN, gather/advanced indexing
# for edge features (x_j - x_i, x_i), Conv2d+BN2d+LeakyReLU, max over neighbours, EdgeConv stack
# with cat, global max+avg pooling, dropout, label-smoothed CE, SGD momentum.
import torch, torch.nn as nn, torch.nn.functional as F
from common import setup, report
policy = setup()
torch.use_deterministic_algorithms(True)
B, N, K, NCLS = 8, 512, 16, 10
def knn(x, k):
    inner = -2 * torch.matmul(x.transpose(2, 1), x)
    xx = torch.sum(x ** 2, dim=1, keepdim=True)
    pd = -xx - inner - xx.transpose(2, 1)
    return pd.topk(k=k, dim=-1)[1]
def get_graph_feature(x, k, use_gather):
    b, c, n = x.shape
    idx = knn(x, k)                                     # b, n, k
    xt = x.transpose(2, 1).contiguous()                 # b, n, c
    if use_gather:
        nb = torch.gather(xt, 1, idx.reshape(b, n * k, 1).expand(b, n * k, c)).view(b, n, k, c)
    else:
        base = torch.arange(b).view(-1, 1, 1) * n
        flat = (idx + base).view(-1)
        nb = xt.view(b * n, -1)[flat, :].view(b, n, k, c)
    xi = xt.view(b, n, 1, c).repeat(1, 1, k, 1)
    return torch.cat((nb - xi, xi), dim=3).permute(0, 3, 1, 2).contiguous()
class EdgeConv(nn.Module):
    def __init__(s, cin, cout, gather):
        super().__init__(); s.g = gather
        s.conv = nn.Sequential(nn.Conv2d(2 * cin, cout, 1, bias=False), nn.BatchNorm2d(cout), nn.LeakyReLU(0.2))
    def forward(s, x): return s.conv(get_graph_feature(x, K, s.g)).max(dim=-1, keepdim=False)[0]
class DGCNN(nn.Module):
    def __init__(s, emb=256):
        super().__init__()
        s.e1 = EdgeConv(3, 64, False); s.e2 = EdgeConv(64, 64, True); s.e3 = EdgeConv(64, 128, False); s.e4 = EdgeConv(128, 128, True)
        s.c5 = nn.Sequential(nn.Conv1d(384, emb, 1, bias=False), nn.BatchNorm1d(emb), nn.LeakyReLU(0.2))
        s.head = nn.Sequential(nn.Linear(emb * 2, 256, bias=False), nn.BatchNorm1d(256), nn.LeakyReLU(0.2), nn.Dropout(0.5),
                               nn.Linear(256, 128), nn.BatchNorm1d(128), nn.LeakyReLU(0.2), nn.Dropout(0.5), nn.Linear(128, NCLS))
    def forward(s, x):
        x1 = s.e1(x); x2 = s.e2(x1); x3 = s.e3(x2); x4 = s.e4(x3)
        x = s.c5(torch.cat((x1, x2, x3, x4), dim=1))
        x = torch.cat((F.adaptive_max_pool1d(x, 1).view(x.size(0), -1), F.adaptive_avg_pool1d(x, 1).view(x.size(0), -1)), 1)
        return s.head(x)
model = DGCNN()
opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)
g = torch.Generator().manual_seed(1)
pts = torch.randn(3, B, 3, N, generator=g); ys = torch.randint(0, NCLS, (3, B), generator=g)
losses = []
model.train()
for step in range(3):
    opt.zero_grad()
    out = model(pts[step])
    loss = F.cross_entropy(out, ys[step], label_smoothing=0.2)
    loss.backward()
    opt.step()
    losses.append(loss.detach())
report(policy, [model], losses)
