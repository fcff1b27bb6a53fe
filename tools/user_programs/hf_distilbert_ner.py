"""Untuned: tiny Hugging Face DistilBERT token classifier (DistilBertForTokenClassification from a
config, no downloads) fine-tuned for NER as a user does: padded word-piece batches with an
attention_mask, labels -100 on padding and on every sub-word but a word's first (the tokenizer's
`word_ids()` alignment, done by hand with a random word segmentation), sinusoidal positions
(`sinusoidal_pos_embds`), dropout, attention dropout and the classifier's `seq_classif_dropout`,
the model's own loss (labels passed) plus a class-weighted `F.cross_entropy` on the logits for the
rare entity tags, the first transformer layer frozen after step 1 (`requires_grad_(False)`),
AdamW, `get_linear_schedule_with_warmup`, `clip_grad_norm_`, 3 steps. SDPA=1: attn_implementation="sdpa"."""
import os
import torch
import torch.nn.functional as F
from common import setup, report
policy = setup()
torch.use_deterministic_algorithms(True)
from transformers import DistilBertConfig, DistilBertForTokenClassification, get_linear_schedule_with_warmup
V, NT = 2048, 9
cfg = DistilBertConfig(vocab_size=V, dim=128, hidden_dim=384, n_layers=2, n_heads=4, max_position_embeddings=256,
                       sinusoidal_pos_embds=True, dropout=0.1, attention_dropout=0.1, seq_classif_dropout=0.2,
                       num_labels=NT, pad_token_id=0)
model = DistilBertForTokenClassification._from_config(cfg, attn_implementation="sdpa" if os.environ.get("SDPA") == "1" else "eager")
model.train()
opt = torch.optim.AdamW(model.parameters(), lr=5e-5 * 20, weight_decay=0.01)
steps = 3
sched = get_linear_schedule_with_warmup(opt, num_warmup_steps=1, num_training_steps=steps)
w = torch.tensor([0.2] + [1.0] * (NT - 1))
B, S = 32, 160
g = torch.Generator().manual_seed(1)
losses = []
for step in range(steps):
    ids = torch.randint(5, V, (B, S), generator=g)
    lens = torch.randint(S // 2, S + 1, (B,), generator=g); lens[0] = S
    am = (torch.arange(S)[None, :] < lens[:, None]).long()
    ids = ids.masked_fill(am == 0, 0)
    ids[:, 0] = 2; ids[torch.arange(B), lens - 1] = 3  # [CLS] ... [SEP]
    tags = torch.randint(0, NT, (B, S), generator=g)
    tags = torch.where(torch.rand(B, S, generator=g) < 0.7, torch.zeros_like(tags), tags)
    first = torch.rand(B, S, generator=g) < 0.6  # a word's first sub-word
    labels = tags.masked_fill(~first | (am == 0), -100)
    labels[:, 0] = -100; labels[torch.arange(B), lens - 1] = -100
    out = model(input_ids=ids, attention_mask=am, labels=labels)
    loss = out.loss + 0.5 * F.cross_entropy(out.logits.view(-1, NT), labels.view(-1), weight=w, ignore_index=-100)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    sched.step()
    opt.zero_grad()
    if step == 0:
        model.distilbert.transformer.layer[0].requires_grad_(False)
    losses.append(loss.detach()); losses.append(out.loss.detach())
report(policy, [model], losses)
