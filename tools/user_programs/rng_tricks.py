# Untuned: randomness every way users write it inside forward. Dropout masks drawn by
# torch.rand(..., generator=g) from a model-owned torch.Generator; torch.manual_seed(step) called
# inside forward (re-seeding the global generator mid-graph, then a global randn noise);
# torch.random.fork_rng() blocks whose draws must not disturb the outer stream; bernoulli_ in
# place on an activation (h.bernoulli_(p) then used as a gate); a torch.randperm feature shuffle
# (global generator); torch.multinomial sampling of classes from the softmax whose sampled
# log-probabilities enter a REINFORCE-style loss; F.dropout and nn.Dropout using the global
# generator between the others; torch.normal with tensor means. SGD. Five steps.
import torch, torch.nn as nn, torch.nn.functional as F
from common import setup, report
policy = setup()
torch.use_deterministic_algorithms(True)
B, D, NC = 1024, 256, 20
class Model(nn.Module):
    def __init__(s):
        super().__init__()
        s.l1, s.l2, s.l3, s.l4 = nn.Linear(64, D), nn.Linear(D, D), nn.Linear(D, D), nn.Linear(D, D)
        s.gate = nn.Linear(D, D); s.head = nn.Linear(D, NC)
        s.drop = nn.Dropout(0.2)
        s.g = torch.Generator().manual_seed(1234)
    def forward(s, x, step):
        h = F.gelu(s.l1(x))
        keep = torch.rand(h.shape, generator=s.g) > 0.1                  # own generator
        h = h * keep / 0.9
        torch.manual_seed(100 + step)                                    # re-seed mid-forward
        h = h + 0.01 * torch.randn_like(h)
        h = F.gelu(s.l2(h))
        with torch.random.fork_rng():
            torch.manual_seed(7)
            noise = torch.randn(h.shape)                                 # outer stream untouched
        h = h + 0.01 * noise
        p = torch.sigmoid(s.gate(h))
        m = torch.empty_like(p).bernoulli_(p.detach())                   # bernoulli_ in place
        g = s.gate(h).clamp(0, 1)                                        # clamp saves its input, not g
        g.bernoulli_(0.8)                                                # in place on an activation
        h = h * (m + g) / 2 + h * p
        perm = torch.randperm(D)
        h = F.gelu(s.l3(h[:, perm]))                                     # feature shuffle
        h = s.drop(h)
        h = h + torch.normal(h.detach() * 0.0, 0.01)
        h = F.dropout(F.gelu(s.l4(h)), 0.1, training=True)
        return s.head(h)
model = Model()
opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
g = torch.Generator().manual_seed(1)
losses = []
for step in range(5):
    x = torch.randn(B, 64, generator=g); y = torch.randint(0, NC, (B,), generator=g)
    logits = model(x, step)
    probs = logits.softmax(-1)
    with torch.random.fork_rng():
        torch.manual_seed(step)
        sample = torch.multinomial(probs.detach(), 2, replacement=True)   # B x 2
    sample2 = torch.multinomial(probs.detach(), 1)
    reward = (sample == y[:, None]).float() - 0.05
    logp = probs.log().gather(1, sample)
    rl = -(reward * logp).mean() - 0.1 * probs.log().gather(1, sample2).mean()
    loss = F.cross_entropy(logits, y) + 0.5 * rl
    opt.zero_grad(); loss.backward(); opt.step()
    losses += [loss.detach(), sample.sum().float(), sample2.sum().float(), torch.rand(())]
report(policy, [model], losses)
