# Untuned: gradient accumulation as most training scripts write it. A pre-norm MLP-mixer-ish
# token model; each optimizer step accumulates 4 micro-batches (loss / 4, backward each), then
# clip_grad_value_, clip_grad_norm_(foreach=True) whose returned total norm is logged,
# AdamW(amsgrad=True) with parameter groups (no decay on norms and biases), a LambdaLR linear
# warmup stepped every optimizer step, and zero_grad(set_to_none=False) so gradients are zeroed in
# place. The micro-batch logits of the last micro-batch are kept for a training accuracy after
# the step. Four optimizer steps.
import torch, torch.nn as nn, torch.nn.functional as F
from common import setup, report
policy = setup()
torch.use_deterministic_algorithms(True)
B, T, D, NC, ACC = 16, 64, 128, 10, 4
class MixerBlock(nn.Module):
    def __init__(s):
        super().__init__()
        s.n1, s.n2 = nn.LayerNorm(D), nn.LayerNorm(D)
        s.tok = nn.Sequential(nn.Linear(T, 2 * T), nn.GELU(), nn.Linear(2 * T, T))
        s.ch = nn.Sequential(nn.Linear(D, 4 * D), nn.GELU(), nn.Dropout(0.1), nn.Linear(4 * D, D))
    def forward(s, x):
        x = x + s.tok(s.n1(x).transpose(1, 2)).transpose(1, 2)
        return x + s.ch(s.n2(x))
class Model(nn.Module):
    def __init__(s):
        super().__init__()
        s.inp = nn.Linear(32, D); s.blocks = nn.Sequential(*[MixerBlock() for _ in range(4)])
        s.norm = nn.LayerNorm(D); s.head = nn.Linear(D, NC)
    def forward(s, x):
        return s.head(s.norm(s.blocks(s.inp(x))).mean(1))
model = Model()
decay = [p for n, p in model.named_parameters() if p.ndim >= 2]
no_decay = [p for n, p in model.named_parameters() if p.ndim < 2]
opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.05}, {"params": no_decay, "weight_decay": 0.0}],
                        lr=3e-3, amsgrad=True)
warmup = 3
sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / warmup))
g = torch.Generator().manual_seed(1)
losses = []
opt.zero_grad(set_to_none=False)
for step in range(4):
    for micro in range(ACC):
        x = torch.randn(B, T, 32, generator=g); y = torch.randint(0, NC, (B,), generator=g)
        logits = model(x)
        loss = F.cross_entropy(logits, y) / ACC
        loss.backward()
        losses.append(loss.detach())
    torch.nn.utils.clip_grad_value_(model.parameters(), clip_value=0.05)
    total = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=0.5, foreach=True)
    opt.step(); sched.step()
    opt.zero_grad(set_to_none=False)
    acc = (logits.argmax(-1) == y).float().mean()
    losses += [total, acc, torch.tensor(sched.get_last_lr()[0])]
report(policy, [model], losses)
