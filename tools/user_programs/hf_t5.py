# Untuned: tiny Hugging Face T5 (built from config, no downloads), seq2seq with labels
# (cross-attention, relative position bias, dropout), AdamW, grad clipping, 3 steps.
import torch
from common import setup, report
policy = setup()
torch.use_deterministic_algorithms(True)
from transformers import T5Config, T5ForConditionalGeneration
cfg = T5Config(vocab_size=512, d_model=128, d_kv=32, d_ff=512, num_layers=2, num_decoder_layers=2,
               num_heads=4, dropout_rate=0.1, decoder_start_token_id=0, pad_token_id=0, eos_token_id=1)
model = T5ForConditionalGeneration(cfg)
model.train()
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
B, S, T = 24, 128, 64
g = torch.Generator().manual_seed(1)
src = torch.randint(2, 512, (3, B, S), generator=g)
tgt = torch.randint(2, 512, (3, B, T), generator=g)
am = torch.ones(3, B, S, dtype=torch.long)
lens = torch.randint(S // 2, S + 1, (3, B), generator=g)
for i in range(3):
    for b in range(B): am[i, b, lens[i, b]:] = 0; src[i, b, lens[i, b]:] = 0
tl = torch.randint(T // 2, T + 1, (3, B), generator=g)
labels = tgt.clone()
for i in range(3):
    for b in range(B): labels[i, b, tl[i, b]:] = -100
losses = []
for step in range(3):
    opt.zero_grad()
    out = model(input_ids=src[step], attention_mask=am[step], labels=labels[step])
    out.loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    losses.append(out.loss.detach())
report(policy, [model], losses)
