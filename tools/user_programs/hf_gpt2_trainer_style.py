# Untuned: Hugging Face GPT-2 (small GPT2Config, no downloads) trained the way transformers' Trainer
# does it, by hand: model.train() with dropout (resid/embd/attn 0.1), right padding (attention_mask
# zeros, labels -100 there), model(input_ids=, attention_mask=, labels=), AdamW with weight-decay
# parameter groups (no decay on bias/LayerNorm), get_linear_schedule_with_warmup, clip_grad_norm_. 3 steps.
import torch
from common import setup, report
policy = setup()
torch.use_deterministic_algorithms(True)
from transformers import GPT2Config, GPT2LMHeadModel, get_linear_schedule_with_warmup
cfg = GPT2Config(vocab_size=1024, n_positions=128, n_embd=192, n_layer=3, n_head=4,
                 resid_pdrop=0.1, embd_pdrop=0.1, attn_pdrop=0.1, pad_token_id=0,
                 bos_token_id=1, eos_token_id=1)
model = GPT2LMHeadModel(cfg)
model.train()
no_decay = ["bias", "LayerNorm.weight", "ln_1.weight", "ln_2.weight", "ln_f.weight"]
grouped = [
    {"params": [p for n, p in model.named_parameters() if not any(nd in n for nd in no_decay)], "weight_decay": 0.01},
    {"params": [p for n, p in model.named_parameters() if any(nd in n for nd in no_decay)], "weight_decay": 0.0},
]
opt = torch.optim.AdamW(grouped, lr=5e-4, betas=(0.9, 0.999), eps=1e-8)
sched = get_linear_schedule_with_warmup(opt, num_warmup_steps=1, num_training_steps=3)
B, S = 16, 128
g = torch.Generator().manual_seed(1)
losses = []
for step in range(3):
    input_ids = torch.randint(1, 1024, (B, S), generator=g)
    lengths = torch.randint(S // 2, S + 1, (B,), generator=g)
    attention_mask = (torch.arange(S)[None, :] < lengths[:, None]).long()
    input_ids = input_ids.masked_fill(attention_mask == 0, cfg.pad_token_id)
    labels = input_ids.masked_fill(attention_mask == 0, -100)
    outputs = model(input_ids=input_ids, attention_mask=attention_mask, labels=labels)
    loss = outputs.loss
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    sched.step()
    opt.zero_grad()
    losses.append(loss.detach())
    losses.append(torch.tensor(sched.get_last_lr()[0]))
report(policy, [model], losses)
