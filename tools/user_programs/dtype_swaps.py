# Untuned: a module's dtype changed mid-training, the way users flip precision. A residual MLP
# token model trained with SGD+momentum, 5 steps. Step 0 in float32; after it model.double()
# (Module._apply rebinding .data) and the optimizer rebuilt; step 1 runs in float64 and, between
# its forward and backward (activations held), an eval copy is made with
# copy.deepcopy(model).to(torch.float32) and run under no_grad, and a linear probe outside the
# model is converted with .half() then .double() and run on the held features; after step 1 the
# model goes back to float32 with
# torch.__future__.set_swap_module_params_on_conversion(True) (torch.utils.swap_tensors under
# Module._apply), with the previous step's float64 features kept for a consistency loss; after
# step 2 a cloned state dict (x1.01) is loaded with load_state_dict(assign=True) and the optimizer
# rebuilt; after step 3 one weight is exchanged with a fresh Parameter by torch.utils.swap_tensors.
import copy, torch, torch.nn as nn, torch.nn.functional as F
from common import setup, report
policy = setup()
torch.use_deterministic_algorithms(True)
B, T, D, C = 48, 64, 256, 16
class Block(nn.Module):
    def __init__(s):
        super().__init__(); s.ln = nn.LayerNorm(D); s.a = nn.Linear(D, 2 * D); s.b = nn.Linear(2 * D, D)
    def forward(s, x): return x + s.b(F.gelu(s.a(s.ln(x))))
class Net(nn.Module):
    def __init__(s):
        super().__init__()
        s.inp = nn.Linear(32, D); s.blocks = nn.ModuleList([Block() for _ in range(4)])
        s.bn = nn.BatchNorm1d(D); s.fc = nn.Linear(D, C); s.aux = nn.Linear(D, C)
    def forward(s, x, use_aux=False):
        h = F.silu(s.inp(x))
        for b in s.blocks: h = b(h)
        h = s.bn(h.transpose(1, 2)).transpose(1, 2)
        out = s.fc(h).mean(1)
        if use_aux: out = out + s.aux(h).mean(1)
        return out, h
model = Net()
probe = nn.Linear(D, C)  # a linear probe on the features, flipped between precisions
opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
g = torch.Generator().manual_seed(1)
losses = []
prev_feat = None
for step in range(5):
    dt = next(model.parameters()).dtype
    x = torch.randn(B, T, 32, generator=g).to(dt)
    y = torch.randint(0, C, (B,), generator=g)
    logits, feat = model(x, use_aux=step != 1)
    loss = F.cross_entropy(logits, y)
    if prev_feat is not None:
        loss = loss + 0.01 * F.mse_loss(feat, prev_feat.to(dt))
    if step == 1:  # float64 graph alive: eval copy in float32, and the unused head flipped
        ev = copy.deepcopy(model).to(torch.float32).eval()
        with torch.no_grad():
            el, ef = ev(x.float())
        losses += [el.square().sum(), ef.sum()]
        probe.half(); losses.append(probe.weight.float().sum()); probe.double()
        with torch.no_grad(): losses.append(probe(feat).square().sum().float())
    opt.zero_grad()
    loss.backward()
    opt.step()
    losses += [loss.detach().float(), feat.detach().float().square().sum()]
    prev_feat = feat.detach()
    if step == 0:
        model.double()
        opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    if step == 1:
        del opt, loss, logits, feat  # the step's graph must go before tensors can be swapped
        torch.__future__.set_swap_module_params_on_conversion(True)
        model.to(torch.float32)
        torch.__future__.set_swap_module_params_on_conversion(False)
        opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    if step == 2:
        sd = {k: v.clone() * 1.01 if v.is_floating_point() else v.clone() for k, v in model.state_dict().items()}
        model.load_state_dict(sd, assign=True)
        opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    if step == 3:
        fresh = nn.Parameter(model.blocks[1].a.weight.detach() * 0.5 + 0.01)
        opt.zero_grad(set_to_none=True)
        torch.utils.swap_tensors(model.blocks[1].a.weight, fresh)
        losses.append(fresh.detach().sum())
    losses.append(torch.tensor(prev_feat.float().mean().item()))
report(policy, [model], losses)
