# Untuned: mixed precision the way CUDA users write it, on the CPU: torch.autocast("cpu",
# dtype=torch.float16) around a small nn.TransformerEncoder classifier (batch_first=True,
# norm_first=True, key_padding_mask), label-smoothing cross-entropy, torch.amp.GradScaler("cpu")
# with scale / unscale_ / clip_grad_norm_ / step / update (init_scale chosen so the inf check
# runs and no step is skipped; the scale is reported), AdamW, 3 steps.
import torch, torch.nn as nn, torch.nn.functional as F
from common import setup, report
policy = setup()
V, D, L, B, C = 1000, 128, 128, 16, 5
class Classifier(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(V, D, padding_idx=0)
        self.pos = nn.Parameter(torch.randn(1, L, D) * 0.02)
        layer = nn.TransformerEncoderLayer(D, nhead=4, dim_feedforward=4 * D, dropout=0.1,
                                           activation="gelu", batch_first=True, norm_first=True)
        self.encoder = nn.TransformerEncoder(layer, num_layers=4, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(D)
        self.head = nn.Linear(D, C)
    def forward(self, tokens, pad_mask):
        h = self.emb(tokens) + self.pos[:, :tokens.shape[1]]
        h = self.encoder(h, src_key_padding_mask=pad_mask)
        h = self.norm(h)
        keep = (~pad_mask).unsqueeze(-1).to(h.dtype)
        h = (h * keep).sum(1) / keep.sum(1)
        return self.head(h)
model = Classifier()
opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 10)
crit = nn.CrossEntropyLoss(label_smoothing=0.1)
g = torch.Generator().manual_seed(1)
losses = []
for step in range(3):
    lengths = torch.randint(L // 2, L + 1, (B,), generator=g)
    tokens = torch.randint(1, V, (B, L), generator=g)
    pad_mask = torch.arange(L)[None, :] >= lengths[:, None]
    tokens = tokens.masked_fill(pad_mask, 0)
    y = torch.randint(0, C, (B,), generator=g)
    opt.zero_grad(set_to_none=True)
    with torch.autocast("cpu", dtype=torch.float16):
        logits = model(tokens, pad_mask)
        loss = crit(logits, y)
    scaler.scale(loss).backward()
    scaler.unscale_(opt)
    gnorm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    scaler.step(opt)
    scaler.update()
    losses += [loss.detach(), gnorm.detach(), torch.tensor(scaler.get_scale())]
report(policy, [model], losses)
