# Untuned: a sequence-to-sequence model on nn.TransformerEncoder / nn.TransformerDecoder with
# pre-norm layers (norm_first=True, batch_first=True, activation="gelu", dropout 0.1) and a final
# LayerNorm on each stack; a second, post-norm nn.TransformerEncoder (norm_first=False,
# enable_nested_tensor=True) re-encodes the memory. Variable source lengths give a boolean
# src_key_padding_mask (also memory_key_padding_mask), the target a causal float tgt_mask from
# nn.Transformer.generate_square_subsequent_mask with tgt_is_causal=True and a tgt_key_padding_mask;
# learned positions; CrossEntropyLoss(ignore_index=PAD). Five AdamW steps; after steps 1 and 3 an
# eval-mode pass under torch.no_grad (the encoder layers' fast path, _transformer_encoder_layer_fwd,
# and for the post-norm stack the nested-tensor path that drops padded positions), its loss and
# greedy token accuracy logged, then model.train().
import torch, torch.nn as nn, torch.nn.functional as F
from common import setup, report
policy = setup()
torch.use_deterministic_algorithms(True)
V, D, H, FF, B, S, T, PAD = 500, 192, 8, 768, 16, 48, 40, 0
class Seq2Seq(nn.Module):
    def __init__(s):
        super().__init__()
        s.src_emb = nn.Embedding(V, D, padding_idx=PAD); s.tgt_emb = nn.Embedding(V, D, padding_idx=PAD)
        s.pos = nn.Parameter(torch.randn(64, D) * 0.02)
        enc = nn.TransformerEncoderLayer(D, H, FF, 0.1, activation="gelu", batch_first=True, norm_first=True)
        s.encoder = nn.TransformerEncoder(enc, 2, norm=nn.LayerNorm(D))
        post = nn.TransformerEncoderLayer(D, H, FF, 0.1, activation="gelu", batch_first=True, norm_first=False)
        s.reenc = nn.TransformerEncoder(post, 1, enable_nested_tensor=True)
        dec = nn.TransformerDecoderLayer(D, H, FF, 0.1, activation="gelu", batch_first=True, norm_first=True)
        s.decoder = nn.TransformerDecoder(dec, 2, norm=nn.LayerNorm(D))
        s.out = nn.Linear(D, V)
    def forward(s, src, tgt_in):
        src_pad = src == PAD
        tgt_pad = tgt_in == PAD
        x = s.src_emb(src) * D ** 0.5 + s.pos[:src.shape[1]]
        mem = s.encoder(x, src_key_padding_mask=src_pad)
        mem = s.reenc(mem, src_key_padding_mask=src_pad)
        if mem.is_nested:  # the nested-tensor path returns a nested tensor in eval mode
            mem = mem.to_padded_tensor(0.0, (src.shape[0], src.shape[1], D))
        tmask = nn.Transformer.generate_square_subsequent_mask(tgt_in.shape[1])
        y = s.tgt_emb(tgt_in) * D ** 0.5 + s.pos[:tgt_in.shape[1]]
        y = s.decoder(y, mem, tgt_mask=tmask, tgt_is_causal=True, tgt_key_padding_mask=tgt_pad,
                      memory_key_padding_mask=src_pad)
        return s.out(y)
def batch(g, n):
    sl = torch.randint(S // 3, S + 1, (n,), generator=g); tl = torch.randint(T // 3, T + 1, (n,), generator=g)
    sl[0] = S; tl[0] = T
    src = torch.randint(1, V, (n, S), generator=g); tgt = torch.randint(1, V, (n, T + 1), generator=g)
    src[torch.arange(S)[None] >= sl[:, None]] = PAD
    tgt[torch.arange(T + 1)[None] > tl[:, None]] = PAD
    return src, tgt
model = Seq2Seq()
opt = torch.optim.AdamW(model.parameters(), lr=5e-4, betas=(0.9, 0.98))
crit = nn.CrossEntropyLoss(ignore_index=PAD)
g = torch.Generator().manual_seed(1)
vsrc, vtgt = batch(g, 24)
losses = []
for step in range(5):
    src, tgt = batch(g, B)
    logits = model(src, tgt[:, :-1])
    loss = crit(logits.reshape(-1, V), tgt[:, 1:].reshape(-1))
    opt.zero_grad(); loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    losses.append(loss.detach())
    if step in (1, 3):
        model.eval()
        with torch.no_grad():
            vl = model(vsrc, vtgt[:, :-1])
            losses.append(crit(vl.reshape(-1, V), vtgt[:, 1:].reshape(-1)))
            m = vtgt[:, 1:] != PAD
            losses.append((vl.argmax(-1) == vtgt[:, 1:])[m].float().mean())
        model.train()
report(policy, [model], losses)
