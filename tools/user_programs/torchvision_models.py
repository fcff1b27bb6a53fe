# Untuned: a torchvision.models model built without weights (weights=None, weights_backbone=None) and
# trained as torchvision's reference scripts do, for 3 steps on random inputs: SGD (momentum 0.9,
# nesterov, weight decay 1e-4 off the norms' parameters), LinearLR warmup then CosineAnnealingLR by
# SequentialLR stepped per step, clip_grad_norm_, an EMA by AveragedModel(multi_avg_fn=
# get_ema_multi_avg_fn(0.99)) updated every step, model.train(). Classification: transforms.v2
# RandomChoice([MixUp, CutMix]) on the batch and a label-smoothed cross entropy on the soft targets;
# GoogLeNet and Inception v3 return aux logits in training (GoogLeNetOutputs / InceptionOutputs: loss
# + 0.3 or 0.4 of each aux). Segmentation: the dict outputs, CE(out['out']) + 0.5 * CE(out['aux'])
# with ignore_index=255 pixels. Video: CE on a clip. MODEL: resnet18, resnext_small (ResNet(Bottleneck,
# [1,1,1,1], groups=32, width_per_group=4)), wide_resnet_small (ResNet(Bottleneck, [1,1,1,1],
# width_per_group=128)), mobilenet_v2, mobilenet_v3_small, efficientnet_b0, efficientnet_v2_s,
# convnext_tiny, regnet_y_400mf, shufflenet_v2_x0_5 (channel shuffle by view/transpose),
# squeezenet1_1, densenet121, densenet121_me (memory_efficient=True: checkpointed bottlenecks),
# googlenet (aux logits), inception_v3 (aux logits at 299 px, batch 2), mnasnet0_5, swin_t, swin_v2_t,
# vit_small (VisionTransformer(image_size=64, patch_size=8, 4 layers, 128 wide)), vit_b_16
# (image_size=64: 86M parameters), maxvit_t (input_size=(64, 64)), fcn_resnet50, deeplabv3_mobilenet_v3_large,
# lraspp_mobilenet_v3_large (no aux head), r3d_18, r2plus1d_18 (a 3x8x32x32 clip). Not yet run (2026-11-29):
# wide_resnet_small, resnext_small, mobilenet_v2, efficientnet_v2_s, convnext_tiny, densenet121,
# inception_v3, swin_v2_t, vit_b_16, maxvit_t, fcn_resnet50, r2plus1d_18. B=N: batch N instead of
# the model's (at the default batches parameters, gradients, momentum and the EMA are most of the peak).
import os
import torch, torch.nn as nn, torch.nn.functional as F
from common import setup, report
policy = setup()
torch.use_deterministic_algorithms(True)
from vision_libs import import_vision
torchvision, timm = import_vision()
from torchvision import models as M
from torchvision.models import resnet as R, segmentation as SEG, video as V
from torchvision.transforms import v2
from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn
MODEL = os.environ.get("MODEL", "resnet18")
NC = 10
def build():  # (model, kind, input shape)
    if MODEL == "resnext_small": return R.ResNet(R.Bottleneck, [1, 1, 1, 1], num_classes=NC, groups=32, width_per_group=4), "cls", (16, 3, 64, 64)
    if MODEL == "wide_resnet_small": return R.ResNet(R.Bottleneck, [1, 1, 1, 1], num_classes=NC, width_per_group=128), "cls", (8, 3, 64, 64)
    if MODEL == "densenet121_me": return M.densenet121(num_classes=NC, memory_efficient=True), "cls", (8, 3, 64, 64)
    if MODEL == "googlenet": return M.googlenet(num_classes=NC, aux_logits=True, init_weights=True), "cls", (8, 3, 64, 64)
    if MODEL == "inception_v3": return M.inception_v3(num_classes=NC, aux_logits=True, init_weights=True), "cls", (2, 3, 299, 299)
    if MODEL == "vit_small": return M.VisionTransformer(image_size=64, patch_size=8, num_layers=4, num_heads=4, hidden_dim=128, mlp_dim=512, num_classes=NC, dropout=0.1), "cls", (16, 3, 64, 64)
    if MODEL == "vit_b_16": return M.vit_b_16(num_classes=NC, image_size=64), "cls", (8, 3, 64, 64)
    if MODEL == "maxvit_t": return M.maxvit_t(num_classes=NC, input_size=(64, 64)), "cls", (8, 3, 64, 64)
    if MODEL in ("fcn_resnet50", "deeplabv3_mobilenet_v3_large"):
        return getattr(SEG, MODEL)(weights=None, weights_backbone=None, num_classes=NC, aux_loss=True), "seg", (4, 3, 64, 64)
    if MODEL == "lraspp_mobilenet_v3_large": return SEG.lraspp_mobilenet_v3_large(weights=None, weights_backbone=None, num_classes=NC), "seg", (8, 3, 64, 64)
    if MODEL in ("r3d_18", "r2plus1d_18", "mc3_18"): return getattr(V, MODEL)(weights=None, num_classes=NC), "video", (4, 3, 8, 32, 32)
    shape = {"efficientnet_v2_s": (8, 3, 64, 64), "convnext_tiny": (8, 3, 64, 64), "swin_t": (8, 3, 64, 64),
             "swin_v2_t": (8, 3, 64, 64), "densenet121": (8, 3, 64, 64)}.get(MODEL, (16, 3, 64, 64))
    return getattr(M, MODEL)(weights=None, num_classes=NC), "cls", shape
model, kind, shape = build()
if os.environ.get("B"): shape = (int(os.environ["B"]),) + shape[1:]  # B=N: another batch size
model.train()
ema = AveragedModel(model, multi_avg_fn=get_ema_multi_avg_fn(0.99), use_buffers=True)
decay, no_decay = [], []
for n, p in model.named_parameters(): (no_decay if p.ndim <= 1 else decay).append(p)
opt = torch.optim.SGD([{"params": decay, "weight_decay": 1e-4}, {"params": no_decay, "weight_decay": 0.0}],
                      lr=0.05, momentum=0.9, nesterov=True)
sched = torch.optim.lr_scheduler.SequentialLR(opt, [torch.optim.lr_scheduler.LinearLR(opt, start_factor=0.1, total_iters=1),
                                                    torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=2)], milestones=[1])
mix = v2.RandomChoice([v2.MixUp(alpha=0.2, num_classes=NC), v2.CutMix(alpha=1.0, num_classes=NC)])
crit = nn.CrossEntropyLoss(label_smoothing=0.1)
g = torch.Generator().manual_seed(1)
losses = []
for step in range(3):
    x = torch.randn(*shape, generator=g)
    if kind == "seg":
        y = torch.randint(0, NC, (shape[0], shape[2], shape[3]), generator=g)
        y[:, :4] = 255  # an ignored border
        out = model(x)
        loss = F.cross_entropy(out["out"], y, ignore_index=255)
        if "aux" in out: loss = loss + 0.5 * F.cross_entropy(out["aux"], y, ignore_index=255)
    else:
        y = torch.randint(0, NC, (shape[0],), generator=g)
        if kind == "cls": x, y = mix(x, y)
        out = model(x)
        if isinstance(out, M.GoogLeNetOutputs): loss = crit(out.logits, y) + 0.3 * (crit(out.aux_logits1, y) + crit(out.aux_logits2, y))
        elif isinstance(out, M.InceptionOutputs): loss = crit(out.logits, y) + 0.4 * crit(out.aux_logits, y)
        else: loss = crit(out, y)
    opt.zero_grad()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 2.0)
    opt.step(); sched.step()
    ema.update_parameters(model)
    losses.append(loss.detach())
ema.eval()
with torch.no_grad():
    o = ema(x[:2])
    losses.append((o["out"] if isinstance(o, dict) else o).float().square().mean())
report(policy, [model, ema], losses)
