"""nn.TransformerEncoder (norm_first, gelu, batch_first) over conv features with a key
padding mask, a CTC loss head (log_softmax over time), SGD with nesterov, gradient
accumulation over two micro-batches."""
from common import *
from torch import nn
from torch.nn import functional as F
policy = setup()
class ASR(nn.Module):
    def __init__(s, d=192, V=30):
        super().__init__()
        s.conv = nn.Sequential(nn.Conv1d(40, d, 5, 2, 2), nn.GELU(), nn.Conv1d(d, d, 5, 1, 2), nn.GELU())
        layer = nn.TransformerEncoderLayer(d, 4, 4 * d, 0.1, activation="gelu", batch_first=True, norm_first=True)
        s.tr = nn.TransformerEncoder(layer, 3, enable_nested_tensor=False); s.out = nn.Linear(d, V)
    def forward(s, x, pad):
        h = s.conv(x.transpose(1, 2)).transpose(1, 2)
        return s.out(s.tr(h, src_key_padding_mask=pad))
m = ASR(); opt = torch.optim.SGD(m.parameters(), lr=0.01, momentum=0.9, nesterov=True)
g = torch.Generator().manual_seed(1); losses = []
for step in range(3):
    opt.zero_grad()
    for micro in range(2):
        x = torch.randn(16, 400, 40, generator=g); lens = torch.randint(300, 401, (16,), generator=g)
        olens = (lens + 1) // 2; pad = torch.arange(200)[None, :] >= olens[:, None]
        tgt = torch.randint(1, 30, (16, 40), generator=g); tl = torch.randint(20, 41, (16,), generator=g)
        lp = F.log_softmax(m(x, pad), -1).transpose(0, 1)
        loss = F.ctc_loss(lp, tgt, olens, tl, zero_infinity=True) / 2
        loss.backward(); losses.append(loss.item())
    opt.step()
report(policy, [m], losses)
