# Untuned: a hand-written K-FAC preconditioner in the style of the common PyTorch K-FAC repos.
# Forward hooks stash each Linear/Conv2d layer's input activation in a dict on the module
# (module._kfac["a"]); full backward hooks stash the gradient w.r.t. the layer output
# (module._kfac["g"]). After loss.backward() the optimizer reads those stored tensors outside
# autograd: conv inputs are unfolded into patches (F.unfold, in chunks of 16 samples), a homogeneous 1 column appended
# for the bias, and covariance factors A = a^T a / n and G = g^T g / n are kept as running
# averages. Every INV_EVERY steps the damped factors are inverted (Cholesky + cholesky_inverse
# for A, torch.linalg.inv for G); each layer's .grad (weight and bias as one matrix) is replaced
# in place by G^-1 [dW db] A^-1, rescaled by a KL clip, then SGD with momentum. 6 steps.
import torch, torch.nn as nn, torch.nn.functional as F
from common import setup, report
policy = setup()

class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.c1 = nn.Conv2d(3, 32, 3, padding=1)
        self.c2 = nn.Conv2d(32, 32, 3, padding=1)
        self.c3 = nn.Conv2d(32, 64, 3, padding=1, stride=2)
        self.c4 = nn.Conv2d(64, 64, 3, padding=1)
        self.fc1 = nn.Linear(64 * 4 * 4, 128)
        self.fc2 = nn.Linear(128, 10)
    def forward(self, x):
        x = F.relu(self.c1(x))
        x = F.relu(self.c2(x))
        x = F.max_pool2d(x, 2) if x.size(-1) > 16 else x
        x = F.relu(self.c3(x))
        x = F.relu(self.c4(x))
        x = F.adaptive_avg_pool2d(x, 4)
        return self.fc2(F.relu(self.fc1(x.flatten(1))))

class KFAC:
    def __init__(self, model, damping=1e-2, decay=0.95, inv_every=2, kl_clip=1e-3):
        self.layers = [m for m in model.modules() if isinstance(m, (nn.Linear, nn.Conv2d))]
        self.damping, self.decay, self.inv_every, self.kl_clip, self.steps = damping, decay, inv_every, kl_clip, 0
        for m in self.layers:
            m._kfac = {}
            m.register_forward_hook(self._save_input)
            m.register_full_backward_hook(self._save_grad)
    def _save_input(self, m, inp, out):
        if torch.is_grad_enabled():
            m._kfac["a"] = inp[0]  # kept alive until the optimizer reads it
    def _save_grad(self, m, grad_input, grad_output):
        m._kfac["g"] = grad_output[0]
    def _factors(self, m, chunk=16):
        a, g = m._kfac.pop("a"), m._kfac.pop("g")
        B = g.size(0)
        g = g * B  # the loss is a batch mean: per-sample output gradients
        if isinstance(m, nn.Conv2d):  # unfold in chunks of samples to bound the patch matrix
            A, n = 0, 0
            for ac in a.split(chunk):
                p = F.unfold(ac, m.kernel_size, padding=m.padding, stride=m.stride)  # b, C*k*k, L
                p = p.transpose(1, 2).reshape(-1, p.size(1))
                p = torch.cat([p, p.new_ones(p.size(0), 1)], 1)
                A = A + p.t() @ p
                n += p.size(0)
            g = g.permute(0, 2, 3, 1).reshape(-1, g.size(1))
            return A / n, g.t() @ g / n
        a = torch.cat([a, a.new_ones(B, 1)], 1)
        return a.t() @ a / B, g.t() @ g / B
    @torch.no_grad()
    def step(self):
        updates, vg = {}, 0.0
        for m in self.layers:
            A, G = self._factors(m)
            st = m._kfac
            if "A" not in st:
                st["A"], st["G"] = A, G
            else:
                st["A"].mul_(self.decay).add_(A, alpha=1 - self.decay)
                st["G"].mul_(self.decay).add_(G, alpha=1 - self.decay)
            if self.steps % self.inv_every == 0:
                eyeA = torch.eye(st["A"].size(0)) * self.damping ** 0.5
                eyeG = torch.eye(st["G"].size(0)) * self.damping ** 0.5
                st["Ainv"] = torch.cholesky_inverse(torch.linalg.cholesky(st["A"] + eyeA))
                st["Ginv"] = torch.linalg.inv(st["G"] + eyeG)
            grad = torch.cat([m.weight.grad.flatten(1), m.bias.grad.view(-1, 1)], 1)
            upd = st["Ginv"] @ grad @ st["Ainv"]
            updates[m] = upd
            vg += (upd * grad).sum().item()
        nu = min(1.0, (self.kl_clip / max(vg, 1e-12)) ** 0.5)
        for m, upd in updates.items():
            m.weight.grad.copy_(upd[:, :-1].view_as(m.weight)).mul_(nu)
            m.bias.grad.copy_(upd[:, -1]).mul_(nu)
        self.steps += 1

model = Net()
kfac = KFAC(model)
opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
g = torch.Generator().manual_seed(1)
losses = []
for step in range(6):
    x = torch.randn(96, 3, 32, 32, generator=g)
    y = torch.randint(0, 10, (96,), generator=g)
    opt.zero_grad()
    loss = F.cross_entropy(model(x), y)
    loss.backward()
    kfac.step()
    opt.step()
    losses.append(loss.detach())
    with torch.no_grad():  # a quick eval pass: the hooks must not stash under no_grad
        losses.append((model(x[:16]).argmax(1) == y[:16]).float().mean())
report(policy, [model], losses)
