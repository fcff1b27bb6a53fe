"""Untuned: tiny Hugging Face Whisper (WhisperForConditionalGeneration from a config, no downloads)
fine-tuned as a user does on random log-mel features: the conv front end (two Conv1d + GELU, the
second strided) and sinusoidal positions into a 2-layer encoder, a 2-layer decoder with
cross-attention, decoder labels right-padded with -100 (the model shifts them into decoder inputs
and computes its own loss), dropout/attention/activation dropout 0.1 and encoder layerdrop,
AdamW with weight-decay groups, a linear warmup schedule from `transformers.get_scheduler`,
`clip_grad_norm_`, 3 steps. SDPA=0: attn_implementation="eager"."""
import os
import torch
from common import setup, report
policy = setup()
torch.use_deterministic_algorithms(True)
from transformers import WhisperConfig, WhisperForConditionalGeneration, get_scheduler
cfg = WhisperConfig(vocab_size=512, num_mel_bins=80, d_model=96, encoder_layers=2, decoder_layers=2,
                    encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=256,
                    decoder_ffn_dim=256, max_source_positions=200, max_target_positions=64,
                    dropout=0.1, attention_dropout=0.1, activation_dropout=0.1, encoder_layerdrop=0.1,
                    pad_token_id=1, bos_token_id=2, eos_token_id=3, decoder_start_token_id=2,
                    suppress_tokens=None, begin_suppress_tokens=None)
model = WhisperForConditionalGeneration._from_config(
    cfg, attn_implementation="sdpa" if os.environ.get("SDPA", "1") == "1" else "eager")
model.train()
decay = [p for n, p in model.named_parameters() if p.ndim >= 2]
no_decay = [p for n, p in model.named_parameters() if p.ndim < 2]
opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.01}, {"params": no_decay, "weight_decay": 0.0}], lr=1e-3)
steps = 3
sched = get_scheduler("linear", optimizer=opt, num_warmup_steps=1, num_training_steps=steps)
B, T = 24, 48
g = torch.Generator().manual_seed(1)
losses = []
for step in range(steps):
    # log-mel-like features: 400 frames (2 * max_source_positions), clamped as the extractor does
    feats = torch.randn(B, 80, 400, generator=g).clamp_(min=-1.0) * 0.5
    labels = torch.randint(4, 512, (B, T), generator=g)
    lens = torch.randint(T // 3, T + 1, (B,), generator=g)
    labels[:, 0] = 2  # the decoder's start token in the labels, as the tokenizer writes it
    labels[torch.arange(B), lens - 1] = 3
    labels = labels.masked_fill(torch.arange(T)[None, :] >= lens[:, None], -100)
    out = model(input_features=feats, labels=labels[:, 1:])
    out.loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    sched.step()
    opt.zero_grad(set_to_none=True)
    losses.append(out.loss.detach())
report(policy, [model], losses)
