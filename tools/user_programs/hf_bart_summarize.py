"""Untuned: tiny Hugging Face BART (BartForConditionalGeneration from a config, no downloads)
fine-tuned for summarisation as a user does: padded source articles with an attention_mask,
shorter target summaries right-padded with -100 (passed as labels: the model shifts them into
decoder_input_ids with `shift_tokens_right` and computes its own loss, logged), the training loss
label-smoothed by `torch.nn.CrossEntropyLoss(label_smoothing=0.1, ignore_index=-100)` on the
logits (as the Trainer's `label_smoothing_factor` does), learned positions, dropout, attention and
activation dropout 0.1, encoder/decoder layerdrop 0.1, `scale_embedding`, AdamW with weight-decay
groups, a linear warmup schedule from `transformers.get_scheduler`, `clip_grad_norm_`,
gradient accumulation over 2 micro-batches per step, 3 steps."""
import torch
from common import setup, report
policy = setup()
torch.use_deterministic_algorithms(True)
from transformers import BartConfig, BartForConditionalGeneration, get_scheduler
V = 1024
cfg = BartConfig(vocab_size=V, d_model=96, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
                 decoder_attention_heads=4, encoder_ffn_dim=256, decoder_ffn_dim=256,
                 max_position_embeddings=256, dropout=0.1, attention_dropout=0.1, activation_dropout=0.1,
                 encoder_layerdrop=0.1, decoder_layerdrop=0.1, scale_embedding=True,
                 pad_token_id=1, bos_token_id=0, eos_token_id=2, decoder_start_token_id=2, forced_eos_token_id=2)
model = BartForConditionalGeneration(cfg)
model.train()
no_decay = ["bias", "layer_norm.weight", "layernorm_embedding.weight"]
opt = torch.optim.AdamW([
    {"params": [p for n, p in model.named_parameters() if not any(nd in n for nd in no_decay)], "weight_decay": 0.01},
    {"params": [p for n, p in model.named_parameters() if any(nd in n for nd in no_decay)], "weight_decay": 0.0}],
    lr=5e-4)
steps, accum = 3, 2
sched = get_scheduler("linear", optimizer=opt, num_warmup_steps=1, num_training_steps=steps)
crit = torch.nn.CrossEntropyLoss(label_smoothing=0.1, ignore_index=-100)
B, S, T = 16, 192, 48
g = torch.Generator().manual_seed(1)
def batch():
    src = torch.randint(3, V, (B, S), generator=g)
    sl = torch.randint(S // 2, S + 1, (B,), generator=g); sl[0] = S
    am = (torch.arange(S)[None, :] < sl[:, None]).long()
    src[:, 0] = 0; src[torch.arange(B), sl - 1] = 2
    src = src.masked_fill(am == 0, 1)
    tgt = torch.randint(3, V, (B, T), generator=g)
    tl = torch.randint(T // 3, T + 1, (B,), generator=g)
    tgt[:, 0] = 0; tgt[torch.arange(B), tl - 1] = 2
    labels = tgt.masked_fill(torch.arange(T)[None, :] >= tl[:, None], -100)
    return src, am, labels
losses = []
for step in range(steps):
    for micro in range(accum):
        src, am, labels = batch()
        out = model(input_ids=src, attention_mask=am, labels=labels)
        loss = crit(out.logits.view(-1, V), labels.view(-1)) / accum
        loss.backward()
        losses.append(loss.detach()); losses.append(out.loss.detach())
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    sched.step()
    opt.zero_grad(set_to_none=True)
report(policy, [model], losses)
