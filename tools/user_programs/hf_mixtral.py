# Untuned: tiny Hugging Face Mixtral (sparse MoE, 4 experts top-2, GQA, RoPE), causal LM with
# labels and router aux loss (output_router_logits=True), AdamW, grad clipping, 3 steps.
import torch
from common import setup, report
policy = setup()
torch.use_deterministic_algorithms(True)
from transformers import MixtralConfig, MixtralForCausalLM
cfg = MixtralConfig(vocab_size=512, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                    num_attention_heads=4, num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2,
                    max_position_embeddings=512, output_router_logits=True, router_aux_loss_coef=0.02,
                    attention_dropout=0.0, tie_word_embeddings=False)
model = MixtralForCausalLM(cfg)
model.train()
opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
B, S = 16, 128
g = torch.Generator().manual_seed(1)
ids = torch.randint(0, 512, (3, B, S), generator=g)
am = torch.ones(3, B, S, dtype=torch.long)
lens = torch.randint(S // 2, S + 1, (3, B), generator=g); lens[:, 0] = S
for i in range(3):
    for b in range(B): am[i, b, lens[i, b]:] = 0
labels = ids.masked_fill(am == 0, -100)
losses = []
for step in range(3):
    opt.zero_grad()
    out = model(input_ids=ids[step], attention_mask=am[step], labels=labels[step])
    out.loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    losses.append(out.loss.detach()); losses.append(out.aux_loss.detach())
report(policy, [model], losses)
