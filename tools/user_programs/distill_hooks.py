# Untuned: knowledge distillation. A frozen CNN teacher (eval(), requires_grad_(False), run under
# torch.no_grad()) and a smaller student; KL-div on temperature-softened logits plus cross-entropy;
# intermediate feature matching through register_forward_hook that stores activations in a dict for
# both models (MSE between a 1x1-projected student feature and the teacher's); a
# register_full_backward_hook on a student block that scales grad_input; a tensor register_hook on
# an activation that clamps its gradient. SGD with momentum, 3 steps.
import torch, torch.nn as nn, torch.nn.functional as F
from common import setup, report
policy = setup()
def make_cnn(widths, depth, num_classes=10):
    layers, c = [], 3
    for i, w in enumerate(widths):
        stage = []
        for j in range(depth):
            stage += [nn.Conv2d(c if j == 0 else w, w, 3, padding=1), nn.BatchNorm2d(w), nn.ReLU()]
        layers.append(nn.Sequential(*stage))
        if i < len(widths) - 1: layers.append(nn.MaxPool2d(2))
        c = w
    return nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(c, num_classes))
teacher = make_cnn([16, 64, 128], depth=2)
student = make_cnn([16, 32, 64], depth=3)
teacher.eval()
teacher.requires_grad_(False)
proj = nn.Conv2d(32, 64, 1)  # student stage-2 feature -> teacher stage-2 width
features = {}
def save_to(name):
    def hook(module, inp, out):
        features[name] = out
    return hook
teacher[2].register_forward_hook(save_to("teacher_mid"))
student[2].register_forward_hook(save_to("student_mid"))
def scale_grad(module, grad_input, grad_output):
    return tuple(g * 0.5 if g is not None else None for g in grad_input)
student[2].register_full_backward_hook(scale_grad)
opt = torch.optim.SGD(list(student.parameters()) + list(proj.parameters()), lr=0.05, momentum=0.9)
T, alpha = 4.0, 0.7
g = torch.Generator().manual_seed(1)
losses = []
for step in range(3):
    x = torch.randn(32, 3, 32, 32, generator=g)
    y = torch.randint(0, 10, (32,), generator=g)
    with torch.no_grad():
        t_logits = teacher(x)
    s_logits = student(x)
    s_feat = features["student_mid"]
    s_feat.register_hook(lambda grad: grad.clamp(-1e-3, 1e-3))
    t_feat = features["teacher_mid"]
    kd = F.kl_div(F.log_softmax(s_logits / T, dim=1), F.softmax(t_logits / T, dim=1), reduction="batchmean") * T * T
    ce = F.cross_entropy(s_logits, y)
    fm = F.mse_loss(proj(s_feat), t_feat)
    loss = alpha * kd + (1 - alpha) * ce + fm
    opt.zero_grad()
    loss.backward()
    opt.step()
    losses += [loss.detach(), kd.detach(), fm.detach()]
report(policy, [student, proj, teacher], losses)
