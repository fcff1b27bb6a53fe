"""Untuned: tiny Hugging Face Wav2Vec2ForCTC (from a config, no downloads) fine-tuned on raw random
audio as a user fine-tunes wav2vec2 for speech recognition: `transformers.set_seed` (random, numpy
and torch: SpecAugment draws its spans with numpy), the conv feature extractor (three Conv1d with
layer norm, as in the large "stable layer norm" checkpoints) frozen by `model.freeze_feature_encoder()`,
the feature projection, SpecAugment time masking (`mask_time_prob`, written into the features in
place by boolean-index assignment of `masked_spec_embed`; FEATMASK=1: feature-axis masking too),
the grouped positional conv embedding with weight norm, a 2-layer encoder with dropout and
layerdrop, padded audio with an attention_mask, CTC labels right-padded with -100 (the model
computes its own CTC loss, `ctc_zero_infinity`), AdamW, a linear warmup LambdaLR, `clip_grad_norm_`,
3 steps."""
import os
import torch
from common import setup, report
policy = setup()
from transformers import Wav2Vec2Config, Wav2Vec2ForCTC, set_seed
set_seed(0)
cfg = Wav2Vec2Config(vocab_size=32, hidden_size=96, num_hidden_layers=2, num_attention_heads=4,
                     intermediate_size=192, conv_dim=(32, 32, 32), conv_stride=(5, 4, 2),
                     conv_kernel=(10, 8, 4), feat_extract_norm="layer", do_stable_layer_norm=True,
                     num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=4,
                     hidden_dropout=0.1, attention_dropout=0.1, activation_dropout=0.1,
                     feat_proj_dropout=0.1, final_dropout=0.1, layerdrop=0.1,
                     mask_time_prob=0.3, mask_time_length=5,
                     mask_feature_prob=0.2 if os.environ.get("FEATMASK") == "1" else 0.0, mask_feature_length=8,
                     ctc_loss_reduction="mean", ctc_zero_infinity=True, pad_token_id=0)
model = Wav2Vec2ForCTC(cfg)
model.freeze_feature_encoder()
model.train()
opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=3e-4, weight_decay=0.005)
steps, warm = 3, 1
sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min((s + 1) / (warm + 1), max(0.0, (steps - s) / (steps - warm))))
B, N, T = 16, 16000, 24
g = torch.Generator().manual_seed(1)
losses = []
for step in range(steps):
    audio = torch.randn(B, N, generator=g) * 0.1
    alen = torch.randint(N // 2, N + 1, (B,), generator=g); alen[0] = N
    am = (torch.arange(N)[None, :] < alen[:, None]).long()
    audio = audio * am  # zero-padded, normalised audio as the feature extractor returns it
    labels = torch.randint(1, 32, (B, T), generator=g)
    tl = torch.randint(T // 2, T + 1, (B,), generator=g)
    labels = labels.masked_fill(torch.arange(T)[None, :] >= tl[:, None], -100)
    out = model(input_values=audio, attention_mask=am, labels=labels)
    out.loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    sched.step()
    opt.zero_grad()
    losses.append(out.loss.detach())
report(policy, [model], losses)
