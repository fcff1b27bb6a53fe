# Untuned: tiny Hugging Face ViTMAE pre-training (built from config, no downloads). Random masking
# inside forward (torch.rand noise, argsort, gather), pixel reconstruction loss, AdamW, 3 steps.
import os
import torch
from common import setup, report
policy = setup()
torch.manual_seed(42)
from transformers import ViTMAEConfig, ViTMAEForPreTraining
cfg = ViTMAEConfig(image_size=64, patch_size=8, num_channels=3, hidden_size=128, num_hidden_layers=4,
                   num_attention_heads=4, intermediate_size=512, decoder_hidden_size=64,
                   decoder_num_hidden_layers=2, decoder_num_attention_heads=4, decoder_intermediate_size=256,
                   mask_ratio=0.75, norm_pix_loss=True,
                   # DROPOUT=0.1: dropout's draws interleave with the masking noise's
                   hidden_dropout_prob=float(os.environ.get("DROPOUT", 0)),
                   attention_probs_dropout_prob=float(os.environ.get("DROPOUT", 0)))
model = ViTMAEForPreTraining(cfg)
model.train()
opt = torch.optim.AdamW(model.parameters(), lr=1.5e-4, weight_decay=0.05)
B = 48
losses = []
for step in range(3):
    pixels = torch.randn(B, 3, 64, 64)
    out = model(pixel_values=pixels)
    opt.zero_grad()
    out.loss.backward()
    opt.step()
    losses.append(out.loss.detach())
report(policy, [model], losses)
