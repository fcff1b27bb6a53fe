# Untuned: a translation model on the full nn.Transformer (the PyTorch tutorial's Seq2SeqTransformer)
# on random padded source/target pairs. Token embeddings scaled by sqrt(D) plus a sinusoidal
# PositionalEncoding module (a registered buffer, dropout), nn.Transformer(batch_first=False,
# 3 encoder and 3 decoder layers, dropout 0.1); masks as the tutorial builds them:
# generate_square_subsequent_mask for the target, a float zeros source mask, boolean src/tgt key
# padding masks from `== PAD`, memory_key_padding_mask; the decoder input is tgt[:-1], the labels
# tgt[1:]; CrossEntropyLoss(ignore_index=PAD, label_smoothing=0.1) on the flattened logits. Adam with
# betas (0.9, 0.98), eps 1e-9 and the Noam (inverse square root warm-up) LambdaLR, 3 steps; then a
# greedy decode under no_grad in eval mode (model.encode once, model.decode on the growing prefix,
# argmax of the last position, torch.cat) whose tokens are logged.
import math, torch, torch.nn as nn, torch.nn.functional as F
from common import setup, report
policy = setup()
torch.use_deterministic_algorithms(True)
B, LS, LT, V, D, H, FF, PAD, BOS, EOS = 32, 40, 36, 800, 128, 4, 512, 1, 2, 3
class PositionalEncoding(nn.Module):
    def __init__(s, emb_size, dropout, maxlen=5000):
        super().__init__()
        den = torch.exp(-torch.arange(0, emb_size, 2) * math.log(10000) / emb_size)
        pos = torch.arange(0, maxlen).reshape(maxlen, 1)
        pe = torch.zeros((maxlen, emb_size))
        pe[:, 0::2] = torch.sin(pos * den); pe[:, 1::2] = torch.cos(pos * den)
        s.dropout = nn.Dropout(dropout)
        s.register_buffer("pos_embedding", pe.unsqueeze(-2))
    def forward(s, tok_emb): return s.dropout(tok_emb + s.pos_embedding[:tok_emb.size(0), :])
class TokenEmbedding(nn.Module):
    def __init__(s, vocab, emb): super().__init__(); s.embedding = nn.Embedding(vocab, emb); s.emb = emb
    def forward(s, tokens): return s.embedding(tokens.long()) * math.sqrt(s.emb)
class Seq2SeqTransformer(nn.Module):
    def __init__(s):
        super().__init__()
        s.transformer = nn.Transformer(d_model=D, nhead=H, num_encoder_layers=3, num_decoder_layers=3, dim_feedforward=FF, dropout=0.1)
        s.generator = nn.Linear(D, V)
        s.src_tok_emb, s.tgt_tok_emb = TokenEmbedding(V, D), TokenEmbedding(V, D)
        s.positional_encoding = PositionalEncoding(D, dropout=0.1)
    def forward(s, src, trg, src_mask, tgt_mask, src_padding_mask, tgt_padding_mask, memory_key_padding_mask):
        src_emb = s.positional_encoding(s.src_tok_emb(src))
        tgt_emb = s.positional_encoding(s.tgt_tok_emb(trg))
        outs = s.transformer(src_emb, tgt_emb, src_mask, tgt_mask, None, src_padding_mask, tgt_padding_mask, memory_key_padding_mask)
        return s.generator(outs)
    def encode(s, src, src_mask): return s.transformer.encoder(s.positional_encoding(s.src_tok_emb(src)), src_mask)
    def decode(s, tgt, memory, tgt_mask): return s.transformer.decoder(s.positional_encoding(s.tgt_tok_emb(tgt)), memory, tgt_mask)
def create_mask(src, tgt):
    src_seq_len, tgt_seq_len = src.shape[0], tgt.shape[0]
    tgt_mask = nn.Transformer.generate_square_subsequent_mask(tgt_seq_len)
    src_mask = torch.zeros((src_seq_len, src_seq_len)).type(torch.bool)
    return src_mask, tgt_mask, (src == PAD).transpose(0, 1), (tgt == PAD).transpose(0, 1)
def batch(g):
    ls = torch.randint(LS // 2, LS + 1, (B,), generator=g)
    src = torch.full((LS, B), PAD, dtype=torch.long); tgt = torch.full((LT, B), PAD, dtype=torch.long)
    for i in range(B):
        n = int(ls[i]); body = torch.randint(4, V, (n - 2,), generator=g)
        src[:n, i] = torch.cat([torch.tensor([BOS]), body, torch.tensor([EOS])])
        m = min(n, LT); tb = (body.flip(0)[:m - 2] * 7) % (V - 4) + 4
        tgt[:m, i] = torch.cat([torch.tensor([BOS]), tb, torch.tensor([EOS])])
    return src, tgt
model = Seq2SeqTransformer()
for p in model.parameters():
    if p.dim() > 1: nn.init.xavier_uniform_(p)
loss_fn = nn.CrossEntropyLoss(ignore_index=PAD, label_smoothing=0.1)
opt = torch.optim.Adam(model.parameters(), lr=1.0, betas=(0.9, 0.98), eps=1e-9)
sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda st: D ** -0.5 * min((st + 1) ** -0.5, (st + 1) * 4000 ** -1.5))
g = torch.Generator().manual_seed(1)
losses = []
for step in range(3):
    model.train()
    src, tgt = batch(g)
    tgt_input = tgt[:-1, :]
    src_mask, tgt_mask, src_padding_mask, tgt_padding_mask = create_mask(src, tgt_input)
    logits = model(src, tgt_input, src_mask, tgt_mask, src_padding_mask, tgt_padding_mask, src_padding_mask)
    opt.zero_grad()
    tgt_out = tgt[1:, :]
    loss = loss_fn(logits.reshape(-1, logits.shape[-1]), tgt_out.reshape(-1))
    loss.backward()
    opt.step()
    sched.step()
    losses.append(loss.detach())
model.eval()
with torch.no_grad():
    s1 = src[:, :2]
    memory = model.encode(s1, torch.zeros(LS, LS).type(torch.bool))
    ys = torch.full((1, 2), BOS, dtype=torch.long)
    for i in range(10):
        out = model.decode(ys, memory, nn.Transformer.generate_square_subsequent_mask(ys.size(0)).type(torch.bool))
        prob = model.generator(out[-1])
        ys = torch.cat([ys, prob.argmax(1, keepdim=True).t()], 0)
    losses.append(ys.float().sum())
report(policy, [model], losses)
