# Untuned: pipeline parallelism simulated in one process, the way a user prototypes a 1F1B
# schedule before moving the stages to separate GPUs. A small conv-then-transformer model is cut
# into four stages; each stage's input is a detached copy of the previous stage's output with
# requires_grad_() (the "receive" buffer), so every microbatch leaves one autograd graph per
# stage alive. The schedule warms up with NUM_STAGES-1 forwards, then alternates one forward and
# one backward (1F1B), then drains: several microbatches' graphs are alive at once. Backward runs
# stage by stage with torch.autograd.backward(out, grad), the gradient of each stage's input
# handed to the previous stage. Gradients accumulate over microbatches; one AdamW step per batch.
import math, torch, torch.nn as nn, torch.nn.functional as F
from collections import deque
from common import setup, report
policy = setup()

class ConvStem(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.net = nn.Sequential(nn.Conv2d(3, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(),
                                 nn.Conv2d(32, 64, 3, padding=1, stride=2), nn.BatchNorm2d(64), nn.ReLU(),
                                 nn.Conv2d(64, d, 3, padding=1, stride=2))
    def forward(self, x):
        return self.net(x).flatten(2).transpose(1, 2)  # B, tokens, d

class Block(nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.h = heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))
    def forward(self, x):
        B, T, D = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(B, T, 3, self.h, D // self.h).permute(2, 0, 3, 1, 4)
        att = (q @ k.transpose(-1, -2)).mul(1 / math.sqrt(D // self.h)).softmax(-1)
        x = x + self.proj((att @ v).transpose(1, 2).reshape(B, T, D))
        return x + self.mlp(self.ln2(x))

class Head(nn.Module):
    def __init__(self, d, n):
        super().__init__()
        self.block, self.ln, self.fc = Block(d, 4), nn.LayerNorm(d), nn.Linear(d, n)
    def forward(self, x):
        return self.fc(self.ln(self.block(x)).mean(1))

D = 96
stages = nn.ModuleList([ConvStem(D),
                        nn.Sequential(Block(D, 4), Block(D, 4)),
                        nn.Sequential(Block(D, 4), Block(D, 4)),
                        Head(D, 10)])
NUM_STAGES, NUM_MICRO = len(stages), 6
opt = torch.optim.AdamW(stages.parameters(), lr=1e-3, weight_decay=0.01)

def forward_micro(x, y):
    """Runs all stages on one microbatch; returns the per-stage (input, output) pairs and the loss."""
    acts, inp = [], x
    for i, st in enumerate(stages):
        recv = inp.detach().requires_grad_(i > 0)  # stage 0 receives data, no grad wanted
        out = st(recv)
        acts.append((recv, out))
        inp = out
    loss = F.cross_entropy(acts[-1][1], y) / NUM_MICRO
    return acts, loss

def backward_micro(acts, loss):
    grad = None
    for i in reversed(range(NUM_STAGES)):
        recv, out = acts[i]
        if i == NUM_STAGES - 1:
            torch.autograd.backward(loss)
        else:
            torch.autograd.backward(out, grad)
        grad = recv.grad if i > 0 else None
        acts[i] = None  # this stage's graph for the microbatch is done

g = torch.Generator().manual_seed(1)
losses = []
for step in range(4):
    x = torch.randn(NUM_MICRO * 8, 3, 32, 32, generator=g)
    y = torch.randint(0, 10, (NUM_MICRO * 8,), generator=g)
    xs, ys = x.chunk(NUM_MICRO), y.chunk(NUM_MICRO)
    opt.zero_grad(set_to_none=True)
    inflight, total, fwd = deque(), 0.0, 0
    warmup = min(NUM_STAGES - 1, NUM_MICRO)
    for _ in range(warmup):  # warm-up: forwards only
        inflight.append(forward_micro(xs[fwd], ys[fwd])); fwd += 1
    while inflight:  # steady state 1F1B, then drain
        if fwd < NUM_MICRO:
            inflight.append(forward_micro(xs[fwd], ys[fwd])); fwd += 1
        acts, loss = inflight.popleft()
        total += loss.detach()
        backward_micro(acts, loss)
        del acts, loss
    torch.nn.utils.clip_grad_norm_(stages.parameters(), 1.0)
    opt.step()
    losses.append(total)
report(policy, [stages], losses)
