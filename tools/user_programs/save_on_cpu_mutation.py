# Untuned: activation offloading and in-place edits the way a user reaches for them. Each step runs
# inside torch.autograd.graph.allow_mutation_on_saved_tensors() (a dispatch mode that clones a saved
# tensor before an in-place op writes it; keyed by data_ptr and version), forward and backward both.
# The stem runs under torch.autograd.graph.save_on_cpu(pin_memory=False) (pack/unpack hooks). Then,
# in every block, tensors that autograd saved are edited in place afterwards, which plain autograd
# would refuse: the pre-activation read by a gate product is passed through `relu_`, a tanh output
# saved by tanh's backward is masked by `mul_` and the block's input is rescaled by `div_` after
# LayerNorm read it; a wide layer in between keeps memory tight before each edit. A nested
# save_on_cpu covers the head. AdamW, five steps.
import torch, torch.nn as nn, torch.nn.functional as F
from torch.autograd.graph import save_on_cpu, allow_mutation_on_saved_tensors
from common import setup, report
policy = setup()
torch.use_deterministic_algorithms(True)
B, D, NC = 1024, 256, 10
class Block(nn.Module):
    def __init__(s):
        super().__init__()
        s.norm = nn.LayerNorm(D); s.a = nn.Linear(D, D); s.b = nn.Linear(D, D)
        s.wide = nn.Sequential(nn.Linear(D, 4 * D), nn.GELU(), nn.Linear(4 * D, D))
    def forward(s, x):
        n = s.norm(x)                  # saves x (and stats)
        pre = s.a(n)
        g = pre * torch.sigmoid(s.b(n))   # saves pre
        t = torch.tanh(g)              # saves t (its output)
        w = s.wide(t)                  # pressure between the save and the edits
        pre.relu_()                    # in place on a saved tensor
        t.mul_((t > -0.5).float())     # in place on tanh's saved output
        x.div_(1.5)                    # in place on a tensor LayerNorm saved
        return x + w + 0.1 * pre + t
class Model(nn.Module):
    def __init__(s):
        super().__init__()
        s.stem = nn.Sequential(nn.Linear(48, D), nn.GELU(), nn.Linear(D, D), nn.GELU())
        s.blocks = nn.ModuleList([Block() for _ in range(3)])
        s.head = nn.Sequential(nn.LayerNorm(D), nn.Linear(D, NC))
    def forward(s, x):
        with save_on_cpu(pin_memory=False):
            h = s.stem(x) * 1.0        # a fresh tensor: the blocks edit their inputs
        for blk in s.blocks: h = blk(h)
        with save_on_cpu(pin_memory=False):
            return s.head(h)
model = Model()
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
g = torch.Generator().manual_seed(1)
losses = []
for step in range(5):
    x = torch.randn(B, 48, generator=g); y = torch.randint(0, NC, (B,), generator=g)
    with allow_mutation_on_saved_tensors() as ctx:
        logits = model(x)
        loss = F.cross_entropy(logits, y)
        ncloned = len(ctx.cloned)      # saved tensors cloned before an in-place write
        opt.zero_grad(); loss.backward()
    opt.step()
    losses += [loss.detach(), torch.tensor(float(ncloned))]
report(policy, [model], losses)
