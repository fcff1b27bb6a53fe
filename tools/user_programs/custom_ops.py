# Untuned: user-defined ops inside a small CNN. A torch.library.custom_op (Python, mutates_args=())
# with register_fake and register_autograd (setup_context saves tensors); a custom
# autograd.Function that works on its input in place and calls ctx.mark_dirty (saving its output);
# a Function with a @once_differentiable backward that saves its output with
# ctx.save_for_backward; torch.utils.checkpoint.checkpoint_sequential (use_reentrant=False) over
# a Sequential that holds them. SGD with Nesterov momentum, 3 steps.
import torch, torch.nn as nn, torch.nn.functional as F
from torch.autograd.function import once_differentiable
from torch.utils.checkpoint import checkpoint_sequential
from common import setup, report
policy = setup()

@torch.library.custom_op("user_programs::scaled_gelu", mutates_args=())
def scaled_gelu(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return F.gelu(x) * scale.view(1, -1, 1, 1)
@scaled_gelu.register_fake
def _(x, scale):
    return torch.empty_like(x)
def _sg_setup_context(ctx, inputs, output):
    x, scale = inputs
    ctx.save_for_backward(x, scale)
def _sg_backward(ctx, grad):
    x, scale = ctx.saved_tensors
    cdf = 0.5 * (1.0 + torch.erf(x * 0.7071067811865476))
    pdf = torch.exp(-0.5 * x * x) * 0.3989422804014327
    dgelu = cdf + x * pdf
    grad_x = grad * scale.view(1, -1, 1, 1) * dgelu
    grad_scale = (grad * F.gelu(x)).sum(dim=(0, 2, 3))
    return grad_x, grad_scale
scaled_gelu.register_autograd(_sg_backward, setup_context=_sg_setup_context)

class InplaceLeakyReLU(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, slope):
        neg = x < 0
        x.mul_(torch.where(neg, slope, 1.0))
        ctx.mark_dirty(x)
        ctx.slope = slope
        ctx.save_for_backward(x)
        return x
    @staticmethod
    def backward(ctx, grad):
        (y,) = ctx.saved_tensors
        return grad * torch.where(y < 0, ctx.slope, 1.0), None

class SavedOutputTanh(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        y = torch.tanh(x)
        ctx.save_for_backward(y)
        return y
    @staticmethod
    @once_differentiable
    def backward(ctx, grad):
        (y,) = ctx.saved_tensors
        return grad * (1 - y * y)

class ScaledGELU(nn.Module):
    def __init__(self, c):
        super().__init__(); self.scale = nn.Parameter(torch.ones(c))
    def forward(self, x): return scaled_gelu(x, self.scale)
class LeakyInplace(nn.Module):
    def forward(self, x): return InplaceLeakyReLU.apply(x, 0.1)
class Tanh(nn.Module):
    def forward(self, x): return SavedOutputTanh.apply(x)
def block(i, o, act):
    return nn.Sequential(nn.Conv2d(i, o, 3, padding=1), nn.BatchNorm2d(o), act)

class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = block(3, 32, ScaledGELU(32))
        self.body = nn.Sequential(block(32, 32, LeakyInplace()), block(32, 32, Tanh()), block(32, 32, ScaledGELU(32)),
                                  block(32, 32, LeakyInplace()), block(32, 32, Tanh()), block(32, 32, ScaledGELU(32)))
        self.down = nn.Sequential(nn.Conv2d(32, 64, 3, stride=2, padding=1), LeakyInplace(),
                                  block(64, 64, Tanh()), block(64, 64, ScaledGELU(64)))
        self.head = nn.Linear(64, 10)
    def forward(self, x):
        x = self.stem(x)
        x = checkpoint_sequential(self.body, 3, x, use_reentrant=False)
        x = self.down(x)
        return self.head(x.mean(dim=(2, 3)))
model = Net()
opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, nesterov=True)
g = torch.Generator().manual_seed(1)
losses = []
for step in range(3):
    x = torch.randn(32, 3, 32, 32, generator=g)
    y = torch.randint(0, 10, (32,), generator=g)
    loss = F.cross_entropy(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    losses.append(loss.detach())
report(policy, [model], losses)
