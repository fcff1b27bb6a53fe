# Untuned: a model ensemble trained with torch.func, as in the PyTorch "model ensembling" tutorial.
# Four copies of a small conv net (Conv-BN-ReLU x3, dropout, Linear) and a separate MLP are
# stacked with torch.func.stack_module_state; the stacked parameters are leaves that AdamW
# trains. The forward is vmap(functional_call(base_on_meta, (params, buffers), (x,)),
# in_dims=(0, 0, 0), randomness="different") on a per-member minibatch (bootstrap by index_select
# of one batch), BatchNorm in eval mode (running stats in the stacked buffers, untouched) and
# dropout on. Per-member cross-entropy computed inside a second vmap (vmap(F.cross_entropy)),
# plus a diversity term on the members' mean prediction (softmax, log, .mean(0)) outside the vmap;
# loss = per-member losses summed. The stacked params are written back into the models with
# torch.no_grad() copy_ at the end for the report. 3 steps.
# ENS=grad: BatchNorm in train mode (torch.func.replace_all_batch_norm_modules_ on the meta base,
# batch statistics only), all members on the same batch (in_dims=(0, 0, None)), and gradients from
# vmap(grad_and_value(member_loss)) written into the stacked leaves' .grad (no loss.backward()).
import os, copy, torch, torch.nn as nn, torch.nn.functional as F
from torch.func import stack_module_state, functional_call, vmap
from common import setup, report
policy = setup()
torch.use_deterministic_algorithms(True)
M, B, C = 4, 32, 10
def make():
    return nn.Sequential(nn.Conv2d(3, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(),
                         nn.Conv2d(32, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Conv2d(32, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Flatten(), nn.Dropout(0.2), nn.Linear(64 * 8 * 8, C))
models = [make().eval() for _ in range(M)]
params, buffers = stack_module_state(models)
base = copy.deepcopy(models[0]).to("meta")
base.eval()
def fmodel(p, b, x): return functional_call(base, (p, b), (x,))
ens = vmap(fmodel, in_dims=(0, 0, 0), randomness="different")
per_member_ce = vmap(F.cross_entropy)
from torch.func import grad_and_value, replace_all_batch_norm_modules_
if os.environ.get("ENS") == "grad":
    replace_all_batch_norm_modules_(base); base.train()
    buffers = {k: v for k, v in buffers.items() if "num_batches" not in k and "running" not in k}
    def member_loss(p, b, x, y):
        out = functional_call(base, (p, b), (x,))
        return F.cross_entropy(out, y) + 1e-3 * out.pow(2).mean()
    gv = vmap(grad_and_value(member_loss), in_dims=(0, 0, None, None), randomness="different")
opt = torch.optim.AdamW(params.values(), lr=1e-3, weight_decay=1e-2)
g = torch.Generator().manual_seed(1)
losses = []
for step in range(3):
    x = torch.randn(B, 3, 32, 32, generator=g); y = torch.randint(0, C, (B,), generator=g)
    idx = torch.randint(0, B, (M, B), generator=g)
    xs = x.index_select(0, idx.flatten()).view(M, B, 3, 32, 32)
    ys = y[idx]
    if os.environ.get("ENS") == "grad":
        grads, member = gv(params, buffers, x, y)
        for k, p in params.items(): p.grad = grads[k]
        opt.step()
        losses += [*member.detach()]
        continue
    logits = ens(params, buffers, xs)                         # (M, B, C)
    member = per_member_ce(logits, ys)                        # (M,)
    mean_p = logits.softmax(-1).mean(0)
    div = -(mean_p * mean_p.clamp_min(1e-8).log()).sum(-1).mean()
    loss = member.sum() - 0.1 * div
    opt.zero_grad()
    loss.backward()
    opt.step()
    losses += [loss.detach(), *member.detach()]
with torch.no_grad():
    for i, m in enumerate(models):
        for n, p in m.named_parameters(): p.copy_(params[n][i])
    losses.append(ens(params, buffers, xs).square().sum())
report(policy, models, losses)
