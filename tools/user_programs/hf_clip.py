# Untuned: tiny Hugging Face CLIP (built from config, no downloads), contrastive loss via
# return_loss=True, padded input_ids with attention_mask, AdamW, 3 steps.
import torch
from common import setup, report
policy = setup()
from transformers import CLIPConfig, CLIPTextConfig, CLIPVisionConfig, CLIPModel
tcfg = CLIPTextConfig(vocab_size=512, hidden_size=128, intermediate_size=512, num_hidden_layers=2,
                      num_attention_heads=4, max_position_embeddings=64, pad_token_id=0, bos_token_id=1, eos_token_id=2)
vcfg = CLIPVisionConfig(image_size=64, patch_size=8, hidden_size=128, intermediate_size=512,
                        num_hidden_layers=2, num_attention_heads=4)
cfg = CLIPConfig(text_config=tcfg.to_dict(), vision_config=vcfg.to_dict(), projection_dim=64)
model = CLIPModel(cfg)
model.train()
opt = torch.optim.AdamW(model.parameters(), lr=5e-4, weight_decay=0.1)
B, L = 64, 48
g = torch.Generator().manual_seed(1)
losses = []
for step in range(3):
    lens = torch.randint(8, L + 1, (B,), generator=g)
    ids = torch.randint(3, 512, (B, L), generator=g)
    am = (torch.arange(L)[None, :] < lens[:, None]).long()
    ids[:, 0] = 1
    ids[torch.arange(B), lens - 1] = 2
    ids = ids * am
    pixels = torch.randn(B, 3, 64, 64, generator=g)
    out = model(input_ids=ids, attention_mask=am, pixel_values=pixels, return_loss=True)
    opt.zero_grad()
    out.loss.backward()
    opt.step()
    losses.append(out.loss.detach())
report(policy, [model], losses)
