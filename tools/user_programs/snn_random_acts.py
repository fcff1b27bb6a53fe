# Untuned: a self-normalising network with noise everywhere in training mode, on images plus a
# 1-d signal. Conv branch: a stem and six 3x3 convs alternating SELU + F.dropout2d with RReLU
# (random negative slopes, its noise saved for backward) + FeatureAlphaDropout. Signal branch:
# Conv1d + F.dropout1d twice, a mask by empty_like(...).bernoulli_(), then an SELU MLP with AlphaDropout. The branches joined by torch.cat;
# a variational mask drawn in place by bernoulli_ into a preallocated activation-shaped buffer and
# multiplied in; stochastic binary units by torch.bernoulli of sigmoid probabilities
# (straight-through); a discrete bottleneck by F.gumbel_softmax(hard=True) with a code-usage
# entropy term. All noise from the global RNG, never re-seeded. Between steps the head is
# re-initialised under no_grad by nn.init.normal_/zeros_ (and once nn.init.orthogonal_ on another
# layer), Adam's state for them kept. 3 steps.
import math, torch, torch.nn as nn, torch.nn.functional as F
from common import setup, report
policy = setup()
B, S, L, C, HID, G, K, NC = 128, 16, 128, 16, 192, 8, 16, 10
class SNN(nn.Module):
    def __init__(s):
        super().__init__()
        s.c1 = nn.Conv2d(3, C, 3, padding=1)
        s.convs = nn.ModuleList(nn.Conv2d(C, C, 3, padding=1) for _ in range(6))
        s.c3 = nn.Conv2d(C, 32, 3, stride=2, padding=1)
        s.rrelu = nn.RReLU(0.1, 0.3); s.fad = nn.FeatureAlphaDropout(0.1)
        s.s1 = nn.Conv1d(4, 16, 5, padding=2); s.s2 = nn.Conv1d(16, 16, 5, padding=2)
        s.mlp = nn.Sequential(nn.Linear(16 * L // 8, HID), nn.SELU(), nn.AlphaDropout(0.1),
                              *[m for _ in range(3) for m in (nn.Linear(HID, HID), nn.SELU(), nn.AlphaDropout(0.1))])
        s.join = nn.Linear(32 * 4 + HID, HID)
        s.register_buffer("vmask", torch.empty(B, HID), persistent=False)
        s.code = nn.Linear(HID, G * K); s.dec = nn.Linear(G * K, HID); s.head = nn.Linear(HID, NC)
        for m in s.modules():
            if isinstance(m, (nn.Linear, nn.Conv1d, nn.Conv2d)):
                nn.init.kaiming_normal_(m.weight, nonlinearity="linear"); nn.init.zeros_(m.bias)
    def forward(s, img, sig, tau):
        h = F.selu(s.c1(img))
        for i, conv in enumerate(s.convs):             # alternate the two kinds of noise
            if i % 2 == 0: h = F.dropout2d(F.selu(conv(h)), 0.1, s.training)
            else: h = s.fad(s.rrelu(conv(h)))
        h = F.selu(s.c3(h))
        h = F.adaptive_avg_pool2d(h, 2).flatten(1)
        z = F.dropout1d(F.selu(s.s1(sig)), 0.2, s.training)
        z = F.dropout1d(s.rrelu(s.s2(z)), 0.2, s.training)
        keep = torch.empty_like(z).bernoulli_(0.9)     # a hand-made mask, made in place
        z = s.mlp(F.max_pool1d(z * keep, 8).flatten(1))
        u = F.selu(s.join(torch.cat([h, z], 1)))
        s.vmask.bernoulli_(0.9)                         # the same buffer, redrawn each step
        u = u * s.vmask / 0.9
        p = torch.sigmoid(u)
        bits = torch.bernoulli(p.detach())
        u = u + (bits - p).detach() + p - p.detach()    # straight-through binary units
        logits = s.code(u).view(-1, G, K)
        q = F.gumbel_softmax(logits, tau=tau, hard=True, dim=-1)
        out = s.head(s.rrelu(s.dec(q.flatten(1))))
        return out, logits
net = SNN()
opt = torch.optim.Adam(net.parameters(), lr=1e-3)
g = torch.Generator().manual_seed(5)
losses = []
for step in range(3):
    img = torch.randn(B, 3, S, S, generator=g); sig = torch.randn(B, 4, L, generator=g)
    y = torch.randint(0, NC, (B,), generator=g)
    net.train()
    out, logits = net(img, sig, tau=1.0 - 0.2 * step)
    prior = F.log_softmax(logits, -1).exp().mean(0)
    loss = F.cross_entropy(out, y) + 0.1 * (prior * prior.clamp_min(1e-8).log()).sum()
    opt.zero_grad()
    loss.backward()
    opt.step()
    with torch.no_grad():                               # restart the head, as some recipes do
        nn.init.normal_(net.head.weight, 0.0, 1.0 / math.sqrt(net.head.in_features))
        nn.init.zeros_(net.head.bias)
        if step == 1: nn.init.orthogonal_(net.dec.weight)
    losses += [loss.detach(), out.detach().abs().mean(), net.vmask.sum()]
report(policy, [net], losses)
