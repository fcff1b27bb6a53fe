# Untuned: neural style transfer after the PyTorch tutorial (Gatys et al.). A VGG-like conv net with
# fixed random weights (requires_grad_(False), eval mode) gives feature maps after conv1_1, conv2_1,
# conv3_1, conv4_1 (style) and conv3_2 (content); style targets are Gram matrices (features viewed as
# (b, c, h*w), torch.bmm with the transpose, divided by c*h*w) of a style image computed under
# no_grad, the content target the detached conv3_2 features of the content image. The optimised
# tensor is the image itself: an nn.Parameter started from the content image plus a little noise,
# optimised by torch.optim.LBFGS (lr 1, max_iter 6, history 8, line_search_fn="strong_wolfe") with a
# closure that clamps the image into [0, 1] in place under no_grad (as the tutorial does), runs the
# net, and backpropagates style_weight * style MSE + content MSE + a total-variation term. 3 outer
# steps; every closure's losses and the final image (hashed) are reported.
import torch, torch.nn as nn, torch.nn.functional as F
from common import setup, report
policy = setup()
torch.use_deterministic_algorithms(True)
R, SW, CW, TVW = 128, 1e5, 1.0, 1e-3
cfg = [("conv1_1", 3, 32), ("relu1_1",), ("conv1_2", 32, 32), ("relu1_2",), ("pool1",),
       ("conv2_1", 32, 64), ("relu2_1",), ("conv2_2", 64, 64), ("relu2_2",), ("pool2",),
       ("conv3_1", 64, 128), ("relu3_1",), ("conv3_2", 128, 128), ("relu3_2",), ("pool3",),
       ("conv4_1", 128, 128), ("relu4_1",)]
layers = []
for c in cfg:
    if c[0].startswith("conv"): layers.append((c[0], nn.Conv2d(c[1], c[2], 3, padding=1)))
    elif c[0].startswith("relu"): layers.append((c[0], nn.ReLU(inplace=False)))
    else: layers.append((c[0], nn.AvgPool2d(2)))
net = nn.Sequential(__import__("collections").OrderedDict(layers)).eval().requires_grad_(False)
STYLE, CONTENT = ["conv1_1", "conv2_1", "conv3_1", "conv4_1"], ["conv3_2"]
mean = torch.tensor([0.485, 0.456, 0.406]).view(1, 3, 1, 1)
std = torch.tensor([0.229, 0.224, 0.225]).view(1, 3, 1, 1)
def features(img):
    out = {}
    x = (img - mean) / std
    for name, layer in net.named_children():
        x = layer(x)
        if name in STYLE or name in CONTENT: out[name] = x
        if name == "conv4_1": break
    return out
def gram(f):
    b, c, h, w = f.shape
    f = f.view(b, c, h * w)
    return torch.bmm(f, f.transpose(1, 2)) / (c * h * w)
g = torch.Generator().manual_seed(1)
content = F.interpolate(torch.rand(1, 3, R // 8, R // 8, generator=g), size=R, mode="bicubic", align_corners=False).clamp(0, 1)
style = (torch.sin(torch.linspace(0, 40, R)).view(1, 1, 1, R) * torch.cos(torch.linspace(0, 25, R)).view(1, 1, R, 1) * 0.5 + 0.5).expand(1, 3, R, R) * torch.rand(1, 3, 1, 1, generator=g)
with torch.no_grad():
    sf = features(style)
    style_targets = {k: gram(sf[k]) for k in STYLE}
    content_targets = {k: features(content)[k].detach() for k in CONTENT}
class Canvas(nn.Module):
    def __init__(s, init):
        super().__init__()
        s.img = nn.Parameter(init.clone())
canvas = Canvas(content + 0.05 * torch.randn(content.shape, generator=g))
opt = torch.optim.LBFGS([canvas.img], lr=1, max_iter=6, history_size=8, line_search_fn="strong_wolfe")
losses = []
def closure():
    with torch.no_grad(): canvas.img.clamp_(0, 1)
    opt.zero_grad()
    feats = features(canvas.img)
    s_loss = sum(F.mse_loss(gram(feats[k]), style_targets[k]) for k in STYLE)
    c_loss = sum(F.mse_loss(feats[k], content_targets[k]) for k in CONTENT)
    img = canvas.img
    tv = (img[:, :, 1:, :] - img[:, :, :-1, :]).abs().mean() + (img[:, :, :, 1:] - img[:, :, :, :-1]).abs().mean()
    loss = SW * s_loss + CW * c_loss + TVW * tv
    loss.backward()
    losses.extend([s_loss.detach(), c_loss.detach()])
    return loss
for step in range(3):
    loss = opt.step(closure)
    losses.append(loss.detach())
with torch.no_grad(): canvas.img.clamp_(0, 1)
losses.append(canvas.img.detach().sum())
report(policy, [canvas, net], losses)
