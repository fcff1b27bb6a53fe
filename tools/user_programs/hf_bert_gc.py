# Untuned: small Hugging Face BERT sequence classifier (built from config, no downloads) with
# gradient checkpointing (model.gradient_checkpointing_enable(); REENTRANT=1: with
# gradient_checkpointing_kwargs={"use_reentrant": True}), dropout on, AdamW + linear warmup schedule, 3 steps.
import os
import torch
from common import setup, report
policy = setup()
from transformers import BertConfig, BertForSequenceClassification, get_linear_schedule_with_warmup
cfg = BertConfig(vocab_size=1024, hidden_size=128, num_hidden_layers=4, num_attention_heads=4,
                 intermediate_size=512, max_position_embeddings=128, num_labels=3,
                 hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1)
model = BertForSequenceClassification(cfg)
model.gradient_checkpointing_enable(
    gradient_checkpointing_kwargs={"use_reentrant": os.environ.get("REENTRANT") == "1"})
model.train()
opt = torch.optim.AdamW(model.parameters(), lr=2e-4, weight_decay=0.01)
sched = get_linear_schedule_with_warmup(opt, num_warmup_steps=1, num_training_steps=3)
B, S = 32, 128
g = torch.Generator().manual_seed(1)
losses = []
for step in range(3):
    lens = torch.randint(S // 2, S + 1, (B,), generator=g)
    ids = torch.randint(5, 1024, (B, S), generator=g)
    am = (torch.arange(S)[None, :] < lens[:, None]).long()
    ids = ids * am
    tt = torch.zeros_like(ids)
    labels = torch.randint(0, 3, (B,), generator=g)
    out = model(input_ids=ids, attention_mask=am, token_type_ids=tt, labels=labels)
    out.loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step(); sched.step(); opt.zero_grad()
    losses.append(out.loss.detach())
report(policy, [model], losses)
