# Untuned: parameter-efficient fine-tuning with peft.get_peft_model on small Hugging Face models
# built from configs (no downloads; the "pretrained" weights are the random init), base weights
# frozen by peft, AdamW over the trainable parameters only (filter on requires_grad), linear
# warmup schedule, gradient clipping, 3 steps, dropout on, then an eval forward under no_grad.
# MODEL picks the variant:
#   gpt2_lora (default): GPT2LMHeadModel, LoRA r=8 on c_attn/c_proj/c_fc (Conv1D:
#     fan_in_fan_out=True), lora_dropout 0.1, causal-LM loss with padding labels -100.
#   llama_dora: LlamaForCausalLM with grouped-query attention (4 heads, 2 KV heads), DoRA
#     (LoraConfig(use_dora=True)) on q/k/v/o/gate/up/down projections.
#   llama_gc: the same Llama with plain LoRA (rslora, bias="lora_only") and gradient
#     checkpointing (model.gradient_checkpointing_enable(use_reentrant=False) plus
#     enable_input_require_grads()).
#   llama_gc_reentrant: as llama_gc with use_reentrant=True (where enable_input_require_grads
#     is what makes reentrant checkpointing produce LoRA gradients).
#   bert_ia3: BertForSequenceClassification with IA3 on key/value/output.dense (feed-forward:
#     output.dense), the classifier in modules_to_save (task_type SEQ_CLS).
#   bert_loha: BertForSequenceClassification with LoHa (r=4, alpha=8, module_dropout 0.1) on
#     query/value, classifier trained through modules_to_save.
#   t5_lora: T5ForConditionalGeneration, LoRA on q/v/o/wi/wo with lora_dropout, labels with
#     padding -100 (decoder inputs shifted by the model), task_type SEQ_2_SEQ_LM.
#   gpt2_prefix: prefix tuning (num_virtual_tokens 10, prefix_projection=True) on GPT-2.
import os
import torch
from common import setup, report
policy = setup()
from vision_libs import define_torchvision_ops
define_torchvision_ops()  # transformers, peft and lightning import torchvision (vision_libs.py)
import peft
from peft import LoraConfig, IA3Config, LoHaConfig, PrefixTuningConfig, get_peft_model, TaskType
import transformers
from transformers import get_linear_schedule_with_warmup
M = os.environ.get("MODEL", "gpt2_lora")
V, B, S = 1000, 8, 64
g = torch.Generator().manual_seed(1)
kind = "lm"
if M.startswith("gpt2"):
    cfg = transformers.GPT2Config(vocab_size=V, n_positions=128, n_embd=128, n_layer=4, n_head=4)
    base = transformers.GPT2LMHeadModel(cfg)
    if M == "gpt2_prefix":
        pc = PrefixTuningConfig(task_type=TaskType.CAUSAL_LM, num_virtual_tokens=10, prefix_projection=True,
                                encoder_hidden_size=64)
    else:
        pc = LoraConfig(task_type=TaskType.CAUSAL_LM, r=8, lora_alpha=16, lora_dropout=0.1,
                        target_modules=["c_attn", "c_proj", "c_fc"], fan_in_fan_out=True)
elif M.startswith("llama"):
    cfg = transformers.LlamaConfig(vocab_size=V, hidden_size=128, intermediate_size=256, num_hidden_layers=3,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                                   attention_dropout=0.1, tie_word_embeddings=False)
    base = transformers.LlamaForCausalLM(cfg)
    tm = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    if M == "llama_dora":
        pc = LoraConfig(task_type=TaskType.CAUSAL_LM, r=8, lora_alpha=16, lora_dropout=0.05, target_modules=tm, use_dora=True)
    else:
        pc = LoraConfig(task_type=TaskType.CAUSAL_LM, r=8, lora_alpha=16, lora_dropout=0.05, target_modules=tm,
                        use_rslora=True, bias="lora_only")
elif M.startswith("bert"):
    kind = "cls"
    cfg = transformers.BertConfig(vocab_size=V, hidden_size=128, num_hidden_layers=3, num_attention_heads=4,
                                  intermediate_size=256, max_position_embeddings=128, num_labels=3)
    base = transformers.BertForSequenceClassification(cfg)
    if M == "bert_ia3":
        pc = IA3Config(task_type=TaskType.SEQ_CLS, target_modules=["key", "value", "output.dense"],
                       feedforward_modules=["output.dense"])
    else:
        pc = LoHaConfig(task_type=TaskType.SEQ_CLS, r=4, alpha=8, module_dropout=0.1, rank_dropout=0.1,
                        target_modules=["query", "value"], modules_to_save=["classifier"])
elif M == "t5_lora":
    kind = "s2s"
    cfg = transformers.T5Config(vocab_size=V, d_model=128, d_kv=32, d_ff=256, num_layers=2, num_decoder_layers=2,
                                num_heads=4, decoder_start_token_id=0, pad_token_id=0)
    base = transformers.T5ForConditionalGeneration(cfg)
    pc = LoraConfig(task_type=TaskType.SEQ_2_SEQ_LM, r=8, lora_alpha=32, lora_dropout=0.1, target_modules=["q", "v", "o", "wi", "wo"])
else:
    raise SystemExit(f"unknown MODEL {M}")
model = get_peft_model(base, pc)
if M.startswith("llama_gc"):
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": M.endswith("reentrant")})
    model.enable_input_require_grads()
model.train()
params = [p for p in model.parameters() if p.requires_grad]
opt = torch.optim.AdamW(params, lr=3e-3, weight_decay=0.01)
sched = get_linear_schedule_with_warmup(opt, num_warmup_steps=1, num_training_steps=3)
losses = []
def batch():
    lens = torch.randint(S // 2, S + 1, (B,), generator=g)
    am = (torch.arange(S)[None, :] < lens[:, None]).long()
    ids = torch.randint(1, V, (B, S), generator=g) * am
    if kind == "lm":
        return dict(input_ids=ids, attention_mask=am, labels=ids.masked_fill(am == 0, -100))
    if kind == "cls":
        return dict(input_ids=ids, attention_mask=am, labels=torch.randint(0, 3, (B,), generator=g))
    tl = torch.randint(1, V, (B, S // 2), generator=g)
    tl[:, -5:] = -100
    return dict(input_ids=ids, attention_mask=am, labels=tl)
for step in range(3):
    out = model(**batch())
    out.loss.backward()
    torch.nn.utils.clip_grad_norm_(params, 1.0)
    opt.step(); sched.step(); opt.zero_grad()
    losses.append(out.loss.detach())
model.eval()
with torch.no_grad():
    out = model(**batch())
    losses += [out.loss, out.logits.float().square().mean()]
report(policy, [model], losses)
