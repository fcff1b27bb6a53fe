# Untuned: a timm model as a timm user trains it, for 3 steps on random images: timm.create_model(MODEL,
# pretrained=False, num_classes=10, drop_path_rate=0.1, ...) with a small input (32-64 px; the model's
# own img_size/window kwargs shrunk where it takes them, tiny depths and widths for the transformers),
# model.train(); timm.data.Mixup (mixup and cutmix, label smoothing 0.1) with SoftTargetCrossEntropy
# (MIXUP=0: LabelSmoothingCrossEntropy(0.1) on hard labels); AdamW from
# timm.optim.create_optimizer_v2 (no weight decay on biases and norms), a CosineLRScheduler with
# warmup stepped per update by step_update, timm.utils.dispatch_clip_grad (norm 1.0) and a
# timm.utils.ModelEmaV3 of the weights updated every step. CKPT=1: model.set_grad_checkpointing(True).
# B=N: batch N instead of the model's (at the default batches the parameters, gradients, AdamW moments
# and the EMA are most of the peak, so 0.5 of it is often below what cannot be evicted).
# MODEL (run, 2026-11-29): vit_tiny_patch16_224 (patch 8 at 64 px), deit_tiny_distilled_patch16_224
# (two heads in training: set_distilled_training, loss on both), swin_tiny_patch4_window7_224 (64 px,
# window 4, depths 2,2,2,2), convnext_atto, efficientnet_b0, mobilenetv3_small_100, regnetx_002,
# resnest14d (split attention), levit_128s (64 px, attention biases by resolution), poolformer_s12,
# mobilevit_xxs, nf_resnet26 (scaled weight standardisation), beit_base_patch16_224 (4 blocks, 192
# wide: relative position bias), eva02_tiny_patch14_224 (56 px, rotary embeddings), maxvit_nano_rw_256
# (64 px). In CFG but not yet run (may not build at these sizes): tf_efficientnet_lite0, resnet18d,
# dla34, ghostnet_100, hrnet_w18_small, coatnet_nano_rw_224, rexnet_100, cspresnet50, cspdarknet53,
# gcvit_xxtiny, edgenext_xx_small, inception_v3 (aux_logits=True at 299 px, batch 2), xcit_nano_12_p16_224,
# mixer_s16_224, sequencer2d_s (LSTMs), pvt_v2_b0, fastvit_t8, efficientvit_b0, hiera_tiny_224,
# tresnet_m, mambaout_femto, repvgg_a0.
import os
import numpy as np
import torch
from common import setup, report
policy = setup()
np.random.seed(0)  # timm's Mixup draws lambda and the mode from numpy
torch.use_deterministic_algorithms(True)
from vision_libs import import_vision
torchvision, timm = import_vision()
from timm.data import Mixup
from timm.loss import SoftTargetCrossEntropy, LabelSmoothingCrossEntropy
from timm.optim import create_optimizer_v2
from timm.scheduler import CosineLRScheduler
from timm.utils import dispatch_clip_grad, ModelEmaV3
MODEL = os.environ.get("MODEL", "vit_tiny_patch16_224")
# name: (image size, batch, create_model kwargs)
CFG = {
    "vit_tiny_patch16_224": (64, 16, dict(img_size=64, patch_size=8)),
    "deit_tiny_distilled_patch16_224": (64, 16, dict(img_size=64, patch_size=8)),
    "swin_tiny_patch4_window7_224": (64, 8, dict(img_size=64, window_size=4, depths=(2, 2, 2, 2))),
    "convnext_atto": (64, 16, {}),
    "efficientnet_b0": (64, 16, {}),
    "tf_efficientnet_lite0": (64, 16, {}),
    "mobilenetv3_small_100": (64, 16, {}),
    "regnetx_002": (64, 16, {}),
    "resnet18d": (64, 16, {}),
    "resnest14d": (64, 16, {}),
    "dla34": (64, 16, {}),
    "ghostnet_100": (64, 16, {}),
    "hrnet_w18_small": (64, 8, {}),
    "coatnet_nano_rw_224": (64, 8, dict(img_size=64)),
    "maxvit_nano_rw_256": (64, 8, dict(img_size=64)),
    "levit_128s": (64, 16, dict(img_size=64)),
    "poolformer_s12": (64, 8, {}),
    "mobilevit_xxs": (64, 16, {}),
    "nf_resnet26": (64, 8, {}),
    "rexnet_100": (64, 16, {}),
    "cspresnet50": (64, 8, {}),
    "cspdarknet53": (64, 8, {}),
    "beit_base_patch16_224": (64, 16, dict(img_size=64, patch_size=8, embed_dim=192, depth=4, num_heads=3)),
    "eva02_tiny_patch14_224": (56, 16, dict(img_size=56)),
    "gcvit_xxtiny": (64, 8, dict(img_size=64)),
    "edgenext_xx_small": (64, 16, {}),
    "inception_v3": (299, 2, dict(aux_logits=True)),
    "xcit_nano_12_p16_224": (64, 16, dict(img_size=64)),
    "mixer_s16_224": (64, 16, dict(img_size=64)),
    "sequencer2d_s": (64, 8, dict(img_size=64)),
    "pvt_v2_b0": (64, 16, {}),
    "fastvit_t8": (64, 16, {}),
    "efficientvit_b0": (64, 16, {}),
    "hiera_tiny_224": (64, 8, dict(img_size=(64, 64))),
    "tresnet_m": (64, 8, {}),
    "mambaout_femto": (64, 16, {}),
    "repvgg_a0": (64, 16, {}),
}
S, B, kw = CFG[MODEL]
B = int(os.environ.get("B", B))  # B=N: another batch size (activations outweigh the optimizer state)
model = timm.create_model(MODEL, pretrained=False, num_classes=10, drop_path_rate=0.1, **kw)
if os.environ.get("CKPT") == "1": model.set_grad_checkpointing(True)
if hasattr(model, "set_distilled_training"): model.set_distilled_training(True)
model.train()
ema = ModelEmaV3(model, decay=0.99)
MIX = os.environ.get("MIXUP", "1") == "1"
mixup = Mixup(mixup_alpha=0.8, cutmix_alpha=1.0, prob=1.0, switch_prob=0.5, label_smoothing=0.1, num_classes=10) if MIX else None
crit = SoftTargetCrossEntropy() if MIX else LabelSmoothingCrossEntropy(0.1)
opt = create_optimizer_v2(model, opt="adamw", lr=1e-3, weight_decay=0.05)
sched = CosineLRScheduler(opt, t_initial=3, warmup_t=1, warmup_lr_init=1e-5, t_in_epochs=False)
g = torch.Generator().manual_seed(1)
losses = []
for step in range(3):
    x = torch.randn(B, 3, S, S, generator=g)
    y = torch.randint(0, 10, (B,), generator=g)
    if mixup is not None: x, y = mixup(x, y)
    out = model(x)
    if isinstance(out, (tuple, list)):  # distilled heads / inception aux logits
        loss = crit(out[0], y) + 0.4 * crit(out[1], y)
    else:
        loss = crit(out, y)
    opt.zero_grad()
    loss.backward()
    dispatch_clip_grad(model.parameters(), 1.0)
    opt.step()
    sched.step_update(step + 1)
    ema.update(model, step=step)
    losses.append(loss.detach())
model.eval()
with torch.no_grad(): losses.append(ema.module(x[:2]).float().square().mean())
report(policy, [model, ema.module], losses)
