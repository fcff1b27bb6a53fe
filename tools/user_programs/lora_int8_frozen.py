"""QLoRA-style fine-tuning written by hand: a small pre-norm decoder-only transformer whose base
Linear weights are frozen int8 *buffers* with per-output-row float scales (absmax quantization of
a random init), dequantized on the fly inside forward (`w.to(torch.float32) * scale`, then
F.linear), each wrapped with trainable LoRA adapters (A: kaiming, B: zeros, rank 8, dropout on
the adapter input, scaling alpha/r); the token embedding and LayerNorms frozen too
(requires_grad_(False)), AdamW over the adapters only, 4 steps. Most activations derive from
tensors that require no grad (the dequantized weights, the embedding lookup), and only the
adapter branches' inputs need saving for backward."""
from common import setup, report
import math, torch, torch.nn as nn, torch.nn.functional as F
policy = setup()
V, D, H, T, B, L, R, ALPHA = 512, 128, 4, 96, 24, 3, 8, 16

class Int8LoRALinear(nn.Module):
    def __init__(s, fin, fout, r=R, alpha=ALPHA, p=0.05):
        super().__init__()
        w = torch.empty(fout, fin); nn.init.kaiming_uniform_(w, a=math.sqrt(5))
        scale = w.abs().amax(dim=1, keepdim=True) / 127.0
        s.register_buffer("qweight", torch.round(w / scale).clamp(-127, 127).to(torch.int8))
        s.register_buffer("scale", scale)
        s.register_buffer("bias", torch.zeros(fout))
        s.lora_A = nn.Parameter(torch.empty(r, fin)); nn.init.kaiming_uniform_(s.lora_A, a=math.sqrt(5))
        s.lora_B = nn.Parameter(torch.zeros(fout, r))
        s.drop = nn.Dropout(p); s.scaling = alpha / r
    def forward(s, x):
        w = s.qweight.to(torch.float32) * s.scale          # dequantize on the fly
        base = F.linear(x, w, s.bias)
        return base + (s.drop(x) @ s.lora_A.t() @ s.lora_B.t()) * s.scaling

class Block(nn.Module):
    def __init__(s):
        super().__init__()
        s.n1 = nn.LayerNorm(D); s.qkv = Int8LoRALinear(D, 3 * D); s.o = Int8LoRALinear(D, D)
        s.n2 = nn.LayerNorm(D); s.up = Int8LoRALinear(D, 4 * D); s.down = Int8LoRALinear(4 * D, D)
    def forward(s, x):
        b, t, d = x.shape
        q, k, v = s.qkv(s.n1(x)).view(b, t, 3, H, d // H).permute(2, 0, 3, 1, 4)
        att = (q @ k.transpose(-2, -1)) / math.sqrt(d // H)
        att = att.masked_fill(torch.triu(torch.ones(t, t, dtype=torch.bool), 1), float("-inf")).softmax(-1)
        x = x + s.o((att @ v).transpose(1, 2).reshape(b, t, d))
        return x + s.down(F.gelu(s.up(s.n2(x))))

class LM(nn.Module):
    def __init__(s):
        super().__init__()
        s.emb = nn.Embedding(V, D); s.pos = nn.Embedding(T, D)
        nn.init.normal_(s.emb.weight, std=0.02); nn.init.normal_(s.pos.weight, std=0.02)
        s.blocks = nn.ModuleList(Block() for _ in range(L)); s.norm = nn.LayerNorm(D)
    def forward(s, idx):
        x = s.emb(idx) + s.pos(torch.arange(idx.shape[1]))
        for blk in s.blocks: x = blk(x)
        return s.norm(x) @ s.emb.weight.t()                # tied, frozen head

model = LM()
for n, p in model.named_parameters():
    p.requires_grad_("lora_" in n)
opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=2e-3, weight_decay=0.0)
g = torch.Generator().manual_seed(1); losses = []
for step in range(4):
    t = torch.randint(0, V, (B, T + 1), generator=g)
    loss = F.cross_entropy(model(t[:, :-1]).reshape(-1, V), t[:, 1:].reshape(-1))
    opt.zero_grad(set_to_none=True); loss.backward(); opt.step()
    losses.append(loss.detach())
report(policy, [model], losses)
