"""Untuned: tiny Hugging Face ConvNeXt image classifier (ConvNextForImageClassification from a config,
no downloads) fine-tuned as a user does: patchify stem (4x4 stride-4 conv + channels-first
LayerNorm), stages of 7x7 depthwise convs, channels-last LayerNorm by permute, inverted-bottleneck
MLPs with GELU, layer scale, stochastic depth (drop_path_rate 0.2: per-sample `torch.rand` masks
inside forward), strided downsampling, pooled head; labels smoothed by hand on the logits
(one-hot by `scatter_`, mixed with the uniform distribution, `-(target * log_softmax).sum(-1)`),
the model's own loss (labels passed) logged beside it; on-device augmentation by `torch.flip`
on a random half of the batch; AdamW with weight-decay groups, a linear warmup schedule from
`transformers.get_scheduler`, `clip_grad_norm_`, 3 steps."""
import torch
import torch.nn.functional as F
from common import setup, report
policy = setup()
torch.use_deterministic_algorithms(True)
from transformers import ConvNextConfig, ConvNextForImageClassification, get_scheduler
NC = 10
cfg = ConvNextConfig(num_channels=3, patch_size=4, num_stages=3, hidden_sizes=[32, 64, 128], depths=[2, 2, 2],
                     drop_path_rate=0.2, layer_scale_init_value=1e-6, num_labels=NC, image_size=96)
model = ConvNextForImageClassification(cfg)
model.train()
decay = [p for n, p in model.named_parameters() if p.ndim > 1]
no_decay = [p for n, p in model.named_parameters() if p.ndim <= 1]
opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.05}, {"params": no_decay, "weight_decay": 0.0}], lr=1e-3)
steps = 3
sched = get_scheduler("linear", optimizer=opt, num_warmup_steps=1, num_training_steps=steps)
B, eps = 48, 0.1
g = torch.Generator().manual_seed(1)
losses = []
for step in range(steps):
    x = torch.randn(B, 3, 96, 96, generator=g)
    y = torch.randint(0, NC, (B,), generator=g)
    flip = torch.rand(B, generator=g) < 0.5
    x = torch.where(flip[:, None, None, None], x.flip(-1), x)
    out = model(pixel_values=x, labels=y)
    target = torch.zeros_like(out.logits).scatter_(1, y[:, None], 1.0)
    target = target * (1 - eps) + eps / NC
    loss = -(target * F.log_softmax(out.logits, dim=-1)).sum(-1).mean()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 5.0)
    opt.step()
    sched.step()
    opt.zero_grad(set_to_none=True)
    losses.append(loss.detach()); losses.append(out.loss.detach())
report(policy, [model], losses)
