# Untuned: a Neural Turing Machine on the copy task. An LSTMCell controller; one read and one
# write head, each addressing the memory by content (cosine similarity of a key with every row,
# softmax scaled by a softplus key strength), interpolating with its previous weighting by a
# sigmoid gate, shifting it circularly by a learned 3-tap softmax kernel (three torch.roll's
# weighted and summed), sharpening by pow(gamma) and renormalising. The memory matrix is updated at
# every one of 40 timesteps by erase and add: out of place (M * (1 - w e^T) + w a^T), or with
# INPLACE=1 a clone of it updated in place by mul_ and add_. Read vectors are fed back into the
# controller; the output is read out over the answer phase of the sequence with a BCE-with-logits
# loss. RMSprop (as the paper), clip_grad_norm_, 3 steps.
import os, torch, torch.nn as nn, torch.nn.functional as F
from common import setup, report
policy = setup()
INPLACE = os.environ.get("INPLACE") == "1"
W, B, N, M, H, L = 8, 32, 128, 32, 192, 19          # bits, batch, memory rows, row width, controller, copy length
T = 2 * L + 2                                          # 40 timesteps: sequence, delimiter, recall
class Head(nn.Module):
    def __init__(s, write):
        super().__init__()
        s.write = write
        s.fc = nn.Linear(H, M + 1 + 1 + 3 + 1 + (2 * M if write else 0))
    def address(s, p, mem, w_prev):
        k, beta, g, sh, gamma = p[:, :M], p[:, M], p[:, M + 1], p[:, M + 2:M + 5], p[:, M + 5]
        beta = F.softplus(beta); g = torch.sigmoid(g); sh = torch.softmax(sh, -1); gamma = 1 + F.softplus(gamma)
        sim = F.cosine_similarity(mem, k[:, None, :], dim=-1, eps=1e-8)       # (B, N)
        wc = torch.softmax(beta[:, None] * sim, -1)
        wg = g[:, None] * wc + (1 - g[:, None]) * w_prev
        ws = sh[:, 0:1] * torch.roll(wg, -1, 1) + sh[:, 1:2] * wg + sh[:, 2:3] * torch.roll(wg, 1, 1)
        wp = ws.pow(gamma[:, None])
        return wp / (wp.sum(-1, keepdim=True) + 1e-16)
    def forward(s, h, mem, w_prev):
        p = s.fc(h)
        w = s.address(p, mem, w_prev)
        if not s.write:
            return w, None, None
        e = torch.sigmoid(p[:, M + 6:2 * M + 6]); a = torch.tanh(p[:, 2 * M + 6:])
        return w, e, a
class NTM(nn.Module):
    def __init__(s):
        super().__init__()
        s.ctrl = nn.LSTMCell(W + 2 + M, H)
        s.rh, s.wh = Head(False), Head(True)
        s.out = nn.Linear(H + M, W)
        s.register_buffer("mem0", torch.full((N, M), 1e-6))
        s.r0 = nn.Parameter(torch.randn(M) * 0.01)
    def forward(s, x):
        b = x.shape[1]
        mem = s.mem0.expand(b, N, M)
        r = s.r0.expand(b, M)
        h = torch.zeros(b, H); c = torch.zeros(b, H)
        wr = torch.zeros(b, N); wr[:, 0] = 1
        ww = wr.clone()
        outs = []
        for t in range(T):
            h, c = s.ctrl(torch.cat([x[t], r], -1), (h, c))
            ww, e, a = s.wh(h, mem, ww)
            if INPLACE:
                mem = mem.clone()
                mem.mul_(1 - ww[:, :, None] * e[:, None, :])
                mem.add_(ww[:, :, None] * a[:, None, :])
            else:
                mem = mem * (1 - ww[:, :, None] * e[:, None, :]) + ww[:, :, None] * a[:, None, :]
            wr, _, _ = s.rh(h, mem, wr)
            r = torch.bmm(wr[:, None, :], mem).squeeze(1)
            outs.append(s.out(torch.cat([h, r], -1)))
        return torch.stack(outs)
g = torch.Generator().manual_seed(5)
model = NTM()
opt = torch.optim.RMSprop(model.parameters(), lr=1e-4, momentum=0.9, alpha=0.95)
losses = []
for step in range(3):
    seq = torch.bernoulli(torch.full((L, B, W), 0.5), generator=g)
    x = torch.zeros(T, B, W + 2)
    x[0, :, W] = 1                                     # start marker
    x[1:L + 1, :, :W] = seq
    x[L + 1, :, W + 1] = 1                             # delimiter
    y = model(x)
    logits = y[L + 2:L + 2 + L]
    loss = F.binary_cross_entropy_with_logits(logits, seq)
    opt.zero_grad()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 10.0)
    opt.step()
    with torch.no_grad():
        err = ((logits > 0).float() != seq).float().sum() / B
    losses += [loss.detach(), err]
report(policy, [model], losses)
