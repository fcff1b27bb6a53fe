"""Untuned: tiny Hugging Face Qwen2 causal LM (Qwen2ForCausalLM from a config, no downloads) fine-tuned
as a user does: grouped-query attention (4 query heads over 2 key/value heads, repeat_kv), RoPE,
RMSNorm, SwiGLU MLP, tied input/output embeddings, attention dropout 0.1, left-padded batches
(attention_mask zeros on the left, labels -100 there; the model shifts labels and computes its
own loss), AdamW with no decay on norms and biases, `get_scheduler("cosine")` with warmup,
`clip_grad_norm_`, 3 steps. attn_implementation="eager" (SDPA=1: "sdpa");
GC=1: `model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})`
(with `model.config.use_cache = False`, as the docs tell users); BF16=1: the forward under
`torch.autocast("cpu", dtype=torch.bfloat16)` as the Trainer's `bf16=True` does."""
import os
import torch
from common import setup, report
policy = setup()
torch.use_deterministic_algorithms(True)
from transformers import Qwen2Config, Qwen2ForCausalLM, get_scheduler
cfg = Qwen2Config(vocab_size=1024, hidden_size=128, intermediate_size=352, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                  tie_word_embeddings=True, attention_dropout=0.1, rope_theta=10000.0,
                  pad_token_id=0, bos_token_id=1, eos_token_id=2, use_cache=False)
model = Qwen2ForCausalLM._from_config(cfg, attn_implementation="sdpa" if os.environ.get("SDPA") == "1" else "eager")
assert model.lm_head.weight is model.model.embed_tokens.weight
if os.environ.get("GC") == "1":
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.config.use_cache = False
model.train()
decay = [p for n, p in model.named_parameters() if p.ndim >= 2 and "norm" not in n]
other = [p for n, p in model.named_parameters() if not (p.ndim >= 2 and "norm" not in n)]
opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": other, "weight_decay": 0.0}],
                        lr=3e-4, betas=(0.9, 0.95))
steps = 3
sched = get_scheduler("cosine", optimizer=opt, num_warmup_steps=1, num_training_steps=steps)
B, S = 16, 192
g = torch.Generator().manual_seed(1)
losses = []
for step in range(steps):
    ids = torch.randint(3, 1024, (B, S), generator=g)
    lens = torch.randint(S // 2, S + 1, (B,), generator=g); lens[0] = S
    am = (torch.arange(S)[None, :] >= (S - lens)[:, None]).long()  # left padding, as for decoder-only
    ids = ids.masked_fill(am == 0, cfg.pad_token_id)
    ids[torch.arange(B), S - lens] = cfg.bos_token_id
    labels = ids.masked_fill(am == 0, -100)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=os.environ.get("BF16") == "1"):
        out = model(input_ids=ids, attention_mask=am, labels=labels)
    out.loss.backward()
    gn = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    sched.step()
    opt.zero_grad(set_to_none=True)
    losses.append(out.loss.detach()); losses.append(gn.detach())
report(policy, [model], losses)
