# Untuned: the budget changed while training, then a second model in the same process. Model A, a
# pre-norm transformer encoder (hand-written attention, GELU MLP, dropout) with AdamW, 8 steps at
# the budget B given, changed through the installed engine (pyalloc._engine(None), as pyalloc-demo
# does): step 1 at 0.85 B, step 2 at 2 B, step 3 back at B and lowered to 0.8 B between forward and
# backward (the forward's activations held), step 4 lowered to 0.9 B by a tensor hook in the
# middle of backward, step 5 by set_memory_fraction(B / sim_capacity); at step 6 the budget is set
# to 2 MiB above what is allocated after pyalloc.empty_cache(), the step fails with OutOfMemoryError
# (where it does: set_budget() below the reserved bytes releases only empty cached segments, so the
# cached free memory of segments that hold parameters still serves requests, and under recompute the
# step may fit; caught; parameters and optimizer state must be bit for bit as before: exit 3), the
# budget goes back to B and the step is retried after zero_grad and a rewound RNG. Then model A and
# its optimizer are deleted, gc.collect() and pyalloc.empty_cache(), and model B (a conv net with
# BatchNorm, SGD with momentum) trains 4 steps under the same install. Under plain PyTorch no budget
# is touched.
import gc, hashlib, sys, torch, torch.nn as nn, torch.nn.functional as F
from common import setup, report
policy = setup()
torch.use_deterministic_algorithms(True)
managed = policy != "plain"
if managed:
    import pyalloc
    eng = pyalloc._engine(None)
    B0 = int(sys.argv[2]) if sys.argv[2] != "none" else 4 << 30
    def budget(f): eng.set_budget(int(f * B0))
else:
    def budget(f): pass
D, H, T, N = 128, 4, 96, 24
class Layer(nn.Module):
    def __init__(s):
        super().__init__()
        s.n1 = nn.LayerNorm(D); s.qkv = nn.Linear(D, 3 * D); s.o = nn.Linear(D, D)
        s.n2 = nn.LayerNorm(D); s.f1 = nn.Linear(D, 4 * D); s.f2 = nn.Linear(4 * D, D)
        s.drop = nn.Dropout(0.1)
    def forward(s, x):
        b = x.shape[0]
        q, k, v = s.qkv(s.n1(x)).view(b, T, 3, H, D // H).permute(2, 0, 3, 1, 4)
        a = (q @ k.transpose(-1, -2) / (D // H) ** 0.5).softmax(-1)
        x = x + s.drop(s.o((s.drop(a) @ v).transpose(1, 2).reshape(b, T, D)))
        return x + s.drop(s.f2(F.gelu(s.f1(s.n2(x)))))
class Enc(nn.Module):
    def __init__(s):
        super().__init__()
        s.emb = nn.Embedding(500, D); s.pos = nn.Parameter(torch.randn(T, D) * 0.02)
        s.layers = nn.ModuleList([Layer() for _ in range(3)]); s.out = nn.Linear(D, 500)
    def forward(s, ids):
        h = s.emb(ids) + s.pos
        for i, l in enumerate(s.layers):
            h = l(h)
            if i == 1 and h.requires_grad: h.register_hook(lower_in_backward)
        return s.out(h)
model = Enc()
opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
def digest():
    h = hashlib.sha256()
    for p in model.parameters(): h.update(p.detach().numpy().tobytes())
    for st in opt.state.values():
        for k in sorted(st): h.update(st[k].numpy().tobytes())
    return h.hexdigest()
g = torch.Generator().manual_seed(1)
losses = []
lowered = [False]
def lower_in_backward(grad):
    # Runs in the middle of backward, between layer 2's gradients and layer 1's.
    if lowered[0]: budget(0.9)
    return grad
def train_step(ids):
    logits = model(ids)
    return logits, F.cross_entropy(logits[:, :-1].reshape(-1, 500), ids[:, 1:].reshape(-1))
for step in range(8):
    ids = torch.randint(0, 500, (N, T), generator=g)
    rng0 = torch.get_rng_state()
    if step == 1: budget(0.85)
    if step == 2: budget(2.0)
    if step == 3: budget(1.0)
    if step == 5:
        budget(1.0); eng.set_memory_fraction(B0 / eng.stats()["device_total_bytes"]) if managed else None
    if step == 6: budget(1.0)
    if step == 6 and managed:
        before = digest()
        pyalloc.empty_cache()  # lets go of the previous step's dead nodes first
        eng.set_budget(pyalloc.memory_stats()["allocated_bytes.all.current"] + (2 << 20))
        try:
            logits, loss = train_step(ids)
            loss.backward()
            print("step 6: fitted 2 MiB above the allocated bytes", file=sys.stderr)
        except torch.OutOfMemoryError:
            print("step 6: out of memory as expected", file=sys.stderr)
            if digest() != before: print("state CHANGED by the failed step", file=sys.stderr); sys.exit(3)
        logits = loss = None
        budget(1.0)
        opt.zero_grad()
        torch.set_rng_state(rng0)
    logits, loss = train_step(ids)
    if step == 3: budget(0.8)
    if step == 4: lowered[0] = True
    loss.backward()
    lowered[0] = False
    opt.step()
    opt.zero_grad()
    losses.append(loss.detach()); losses.append(logits.detach()[0, 0].sum())
    del logits, loss
    budget(1.0)
# Model B in the same process, after model A is gone.
hA = hashlib.sha256(b"".join(p.detach().numpy().tobytes() for p in model.parameters())).hexdigest()[:12]
losses.append(torch.tensor(float(int(hA, 16)), dtype=torch.float64))  # model A's parameters, exactly
del model, opt
gc.collect()
if managed: pyalloc.empty_cache()
def cbr(i, o): return nn.Sequential(nn.Conv2d(i, o, 3, padding=1, bias=False), nn.BatchNorm2d(o), nn.ReLU())
model_b = nn.Sequential(cbr(3, 32), cbr(32, 32), nn.MaxPool2d(2), cbr(32, 64), cbr(64, 64),
                        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, 10))
opt_b = torch.optim.SGD(model_b.parameters(), lr=0.05, momentum=0.9)
for step in range(4):
    x = torch.randn(32, 3, 32, 32, generator=g); y = torch.randint(0, 10, (32,), generator=g)
    loss = F.cross_entropy(model_b(x), y)
    loss.backward(); opt_b.step(); opt_b.zero_grad()
    losses.append(loss.detach())
report(policy, [model_b], losses)
