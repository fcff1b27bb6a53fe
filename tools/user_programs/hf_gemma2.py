"""Untuned: tiny Hugging Face Gemma 2 causal LM (Gemma2ForCausalLM from a config, no downloads)
fine-tuned as a user does: embeddings scaled by sqrt(hidden) (a normaliser tensor), alternating
sliding-window (32 tokens) and global layers with their own masks, grouped-query attention (4
query heads over 2 key/value heads), tanh soft-capping of the attention scores and of the final
logits (logits / cap, tanh, * cap, in place on the logits), pre- and post-norm RMSNorm (1 + weight),
GeGLU MLP (gelu_pytorch_tanh), tied embeddings, attention dropout 0.1, eager attention (Gemma 2
has no SDPA with soft-capping), right-padded batches with labels -100 there (the model computes
its own loss), AdamW, `get_scheduler("linear")` with warmup, `clip_grad_norm_`, 3 steps.
GC=1: `gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})`."""
import os
import torch
from common import setup, report
policy = setup()
torch.use_deterministic_algorithms(True)
from transformers import Gemma2Config, Gemma2ForCausalLM, get_scheduler
cfg = Gemma2Config(vocab_size=1024, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                   num_attention_heads=4, num_key_value_heads=2, head_dim=32, max_position_embeddings=512,
                   sliding_window=32, attn_logit_softcapping=50.0, final_logit_softcapping=30.0,
                   query_pre_attn_scalar=32, attention_dropout=0.1, tie_word_embeddings=True,
                   pad_token_id=0, bos_token_id=2, eos_token_id=1, use_cache=False)
model = Gemma2ForCausalLM._from_config(cfg, attn_implementation="eager")
if os.environ.get("GC") == "1":
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
model.train()
opt = torch.optim.AdamW(model.parameters(), lr=2e-4, weight_decay=0.0)
steps = 3
sched = get_scheduler("linear", optimizer=opt, num_warmup_steps=1, num_training_steps=steps)
B, S = 16, 160
g = torch.Generator().manual_seed(1)
losses = []
for step in range(steps):
    ids = torch.randint(3, 1024, (B, S), generator=g)
    lens = torch.randint(S // 2, S + 1, (B,), generator=g); lens[0] = S
    am = (torch.arange(S)[None, :] < lens[:, None]).long()
    ids[:, 0] = cfg.bos_token_id
    ids = ids.masked_fill(am == 0, cfg.pad_token_id)
    labels = ids.masked_fill(am == 0, -100)
    out = model(input_ids=ids, attention_mask=am, labels=labels)
    out.loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    sched.step()
    opt.zero_grad(set_to_none=True)
    losses.append(out.loss.detach())
report(policy, [model], losses)
