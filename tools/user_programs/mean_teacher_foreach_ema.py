"""A mean-teacher semi-supervised loop: a student CNN (conv-BN-ReLU blocks, dropout) trained on
a few labelled and many unlabelled images, each seen under two random augmentations (flip by
torch.where, random shift by torch.roll, additive noise); cross entropy on the labelled part
plus an MSE consistency between the student's softmax on one view and the teacher's (no_grad)
on the other, ramped up. The teacher is an EMA of the student updated by
torch._foreach_mul_/_foreach_add_ over parameter lists (buffers copied by _foreach_copy_);
gradients clipped by clip_grad_norm_(foreach=True); Adam(fused=True) on the CPU with two
parameter groups (weight decay on conv/linear weights, none on biases and BN); 4 steps."""
from common import setup, report
import copy, torch, torch.nn as nn, torch.nn.functional as F
policy = setup()
BL, BU, C, S, K, W = 16, 48, 3, 24, 10, 48

def block(cin, cout):
    return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU())
student = nn.Sequential(block(C, W), block(W, W), nn.MaxPool2d(2), block(W, 2 * W), block(2 * W, 2 * W),
                        nn.MaxPool2d(2), block(2 * W, 2 * W), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                        nn.Dropout(0.3), nn.Linear(2 * W, K))
teacher = copy.deepcopy(student)
for p in teacher.parameters(): p.requires_grad_(False)
decay = [p for n, p in student.named_parameters() if p.ndim > 1]
no_decay = [p for n, p in student.named_parameters() if p.ndim <= 1]
opt = torch.optim.Adam([{"params": decay, "weight_decay": 5e-4}, {"params": no_decay, "weight_decay": 0.0}],
                       lr=1e-3, fused=True)
g = torch.Generator().manual_seed(1)

def augment(x):
    flip = torch.rand(x.shape[0], 1, 1, 1, generator=g) < 0.5
    x = torch.where(flip, x.flip(-1), x)
    x = torch.roll(x, shifts=(int(torch.randint(-2, 3, (), generator=g)), int(torch.randint(-2, 3, (), generator=g))), dims=(2, 3))
    return x + 0.05 * torch.randn(x.shape, generator=g)

@torch.no_grad()
def ema_update(alpha):
    tp, sp = list(teacher.parameters()), list(student.parameters())
    torch._foreach_mul_(tp, alpha)
    torch._foreach_add_(tp, sp, alpha=1 - alpha)
    torch._foreach_copy_(list(teacher.buffers()), list(student.buffers()))

losses = []
for step in range(4):
    xl = torch.randn(BL, C, S, S, generator=g); yl = torch.randint(0, K, (BL,), generator=g)
    xu = torch.randn(BU, C, S, S, generator=g)
    x = torch.cat([xl, xu])
    s_out = student(augment(x))
    with torch.no_grad():
        t_out = teacher(augment(x))
    w = 10.0 * min(1.0, (step + 1) / 4) ** 2
    cons = F.mse_loss(s_out.softmax(-1), t_out.softmax(-1))
    loss = F.cross_entropy(s_out[:BL], yl) + w * cons
    opt.zero_grad(set_to_none=True); loss.backward()
    torch.nn.utils.clip_grad_norm_(student.parameters(), 2.0, foreach=True)
    opt.step(); ema_update(min(0.99, 1 - 1 / (step + 1)))
    losses.append(loss.detach())
report(policy, [student, teacher], losses)
