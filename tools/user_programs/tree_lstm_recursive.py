# Untuned: a binary Tree-LSTM (Tai et al.) as research code writes it. Each step draws random binary
# trees (Python objects built by recursive splitting of a token span), each shared by a small batch
# of sentences (batched by identical parse, as SPINN-style code does); the encoder recurses over each
# tree in Python, a few small tensors per node (16 KiB states, at min_evictable, and larger gate
# pre-activations): leaves embed their tokens, internal nodes torch.cat their children's h,
# run one Linear for the five gates, chunk them and combine cells; every node's h is appended to a
# per-tree list. Per tree: torch.stack of all node states for a node-level loss, the root state for
# a tree-level loss; the roots by torch.stack, an attention pooling over torch.cat of all nodes of
# all trees. Adagrad (as the paper), gradient clipping, four steps.
import torch, torch.nn as nn, torch.nn.functional as F
from common import setup, report
policy = setup()
torch.use_deterministic_algorithms(True)
V, E, H, NC, NT, L, BS = 500, 64, 128, 5, 4, 32, 32
class Tree:
    def __init__(s, lo, hi, g):
        s.lo, s.hi = lo, hi
        if hi - lo > 1:
            mid = int(torch.randint(lo + 1, hi, (1,), generator=g))
            s.kids = (Tree(lo, mid, g), Tree(mid, hi, g))
        else: s.kids = ()
class TreeLSTM(nn.Module):
    def __init__(s):
        super().__init__()
        s.emb = nn.Embedding(V, E)
        s.leaf = nn.Linear(E, 3 * H)
        s.node = nn.Linear(2 * H, 5 * H)
        s.cls = nn.Linear(H, NC); s.att = nn.Linear(H, 1); s.out = nn.Linear(2 * H, NC)
    def encode(s, t, toks, states):
        if not t.kids:
            i, o, u = s.leaf(s.emb(toks[t.lo])).chunk(3, -1)
            c = torch.sigmoid(i) * torch.tanh(u)
            h = torch.sigmoid(o) * torch.tanh(c)
        else:
            (hl, cl), (hr, cr) = s.encode(t.kids[0], toks, states), s.encode(t.kids[1], toks, states)
            i, fl, fr, o, u = s.node(torch.cat([hl, hr], -1)).chunk(5, -1)
            c = torch.sigmoid(i) * torch.tanh(u) + torch.sigmoid(fl) * cl + torch.sigmoid(fr) * cr
            h = torch.sigmoid(o) * torch.tanh(c)
        states.append(h)
        return h, c
model = TreeLSTM()
opt = torch.optim.Adagrad(model.parameters(), lr=0.05)
g = torch.Generator().manual_seed(1)
losses = []
for step in range(4):
    roots, node_loss, all_nodes = [], 0.0, []
    for b in range(NT):
        n = int(torch.randint(L // 2, L + 1, (1,), generator=g))
        toks = torch.randint(0, V, (n, BS), generator=g)
        tree = Tree(0, n, g)
        states = []
        h, c = model.encode(tree, toks, states)
        S = torch.stack(states)                               # all nodes of this tree
        lab = (toks[:len(states) % n + 1].sum(0) + torch.arange(len(states))[:, None]) % NC
        node_loss = node_loss + F.cross_entropy(model.cls(S).flatten(0, 1), lab.flatten())
        roots.append(h); all_nodes.append(S)
    R = torch.stack(roots)                                        # NT x BS x H
    A = torch.cat(all_nodes)                                      # all nodes x BS x H
    w = torch.softmax(model.att(A).squeeze(-1), 0)
    ctx = (w[..., None] * A).sum(0, keepdim=True).expand_as(R)
    y = torch.randint(0, NC, (NT, BS), generator=g)
    loss = node_loss / NT + F.cross_entropy(model.out(torch.cat([R, ctx], -1)).flatten(0, 1), y.flatten())
    opt.zero_grad(); loss.backward()
    gn = torch.nn.utils.clip_grad_norm_(model.parameters(), 5.0)
    opt.step()
    losses += [loss.detach(), gn]
report(policy, [model], losses)
