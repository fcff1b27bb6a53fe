"""Untuned: tiny Hugging Face Swin pre-trained SimMIM-style (SwinForMaskedImageModeling from a config,
no downloads): random patch masks per image (`bool_masked_pos`, a learned mask token mixed in by
`mask * token + (1 - mask) * embeddings`), shifted windows by `torch.roll` with the attention mask
of the shifted windows, window partition/reverse by view/permute, relative position bias gathered
from a table, patch merging by strided slicing and `cat`, stochastic depth (drop_path_rate 0.2),
dropout and attention dropout 0.1, a conv + PixelShuffle decoder and the model's own L1 loss on
the masked pixels (the mask upsampled by `repeat_interleave`), AdamW, a linear warmup LambdaLR,
`clip_grad_norm_`, 3 steps."""
import torch
from common import setup, report
policy = setup()
torch.use_deterministic_algorithms(True)
from transformers import SwinConfig, SwinForMaskedImageModeling
cfg = SwinConfig(image_size=64, patch_size=4, num_channels=3, embed_dim=32, depths=[2, 2], num_heads=[2, 4],
                 window_size=4, mlp_ratio=4.0, hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1,
                 drop_path_rate=0.2, encoder_stride=8)
model = SwinForMaskedImageModeling(cfg)
model.train()
opt = torch.optim.AdamW(model.parameters(), lr=2e-4, weight_decay=0.05)
steps, warm = 3, 1
sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min((s + 1) / (warm + 1), 1.0 - s / steps))
B = 48
n = (64 // 4) ** 2
g = torch.Generator().manual_seed(1)
losses = []
for step in range(steps):
    x = torch.randn(B, 3, 64, 64, generator=g)
    # SimMIM masks 2x2 groups of patches (a mask patch of 8 pixels), 60% of them
    m = (torch.rand(B, 8, 8, generator=g) < 0.6).repeat_interleave(2, 1).repeat_interleave(2, 2)
    out = model(pixel_values=x, bool_masked_pos=m.reshape(B, n))
    out.loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 3.0)
    opt.step()
    sched.step()
    opt.zero_grad()
    losses.append(out.loss.detach())
report(policy, [model], losses)
