# Untuned: a recursive neural network (Socher-style) over very unbalanced binary trees, the way
# research code writes it: each tree is Python objects built by recursion, mostly a "caterpillar"
# (a spine a few hundred nodes deep, each spine node with a leaf or a small random bush on the
# side that the spine passes, left or right at random), and the encoder recurses over it in Python:
# leaves look up an embedding for their token (a batch of 64 sentences sharing the parse, 32 KiB
# per node state), internal nodes torch.cat their children and apply one small Linear(256, 128) +
# tanh. Each step two trees, spines 360 and 200 deep; about one side in twenty is itself a 40-deep
# caterpillar, most are leaves or bushes of up to depth 3. A classifier reads the root (cross-entropy) and every 25th spine node (an auxiliary
# cross-entropy at internal nodes, weighted 0.1), and one mid-spine node's state is reused as an
# extra leaf higher up the same tree (a DAG). Plain SGD with momentum, three steps.
# (DEPTH=N: the longest spine N instead of 360.)
import os, sys, torch, torch.nn as nn, torch.nn.functional as F
from common import setup, report
policy = setup()
torch.use_deterministic_algorithms(True)
sys.setrecursionlimit(10000)
V, H, NC, BS = 1000, 128, 7, 64
DEPTH = int(os.environ.get("DEPTH", "360"))
class Node:
    def __init__(s, kids=(), tok=None, aux=False, reuse=None):
        s.kids, s.tok, s.aux, s.reuse = kids, tok, aux, reuse
def bush(g, depth):
    """A small random balanced-ish subtree."""
    if depth == 0 or float(torch.rand((), generator=g)) < 0.3:
        return Node(tok=int(torch.randint(0, V, (), generator=g)))
    return Node(kids=(bush(g, depth - 1), bush(g, depth - 1)))
def caterpillar(g, n, holder):
    """A spine of n internal nodes, built by recursion from the bottom up."""
    if n == 0:
        return Node(tok=int(torch.randint(0, V, (), generator=g)))
    below = caterpillar(g, n - 1, holder)
    r = float(torch.rand((), generator=g))
    if r < 0.6: side = Node(tok=int(torch.randint(0, V, (), generator=g)))
    elif r < 0.95: side = bush(g, 3)
    elif n > 40: side = caterpillar(g, 40, [])                       # a deep side spine
    else: side = bush(g, 2)
    if n == DEPTH // 3: holder.append(below)                          # reused higher up
    if n == 2 * DEPTH // 3 and holder: side = Node(reuse=holder[0])
    kids = (below, side) if float(torch.rand((), generator=g)) < 0.5 else (side, below)
    return Node(kids=kids, aux=(n % 25 == 0))
class RNN(nn.Module):
    def __init__(s):
        super().__init__()
        s.emb = nn.Embedding(V, H)
        s.comp = nn.Linear(2 * H, H)
        s.cls = nn.Linear(H, NC)
    def encode(s, t, toks, aux, memo):
        if t.reuse is not None:
            return memo[id(t.reuse)]                                  # a node read twice
        if not t.kids:
            h = s.emb(toks[t.tok % toks.shape[0]])
        else:
            a, b = t.kids
            if a.reuse is not None:                                   # the spine first
                hr = s.encode(b, toks, aux, memo); hl = s.encode(a, toks, aux, memo)
            else:
                hl = s.encode(a, toks, aux, memo); hr = s.encode(b, toks, aux, memo)
            h = torch.tanh(s.comp(torch.cat([hl, hr], -1)))
            if t.aux: aux.append(h)
        memo[id(t)] = h
        return h
model = RNN()
opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
g = torch.Generator().manual_seed(1)
losses = []
for step in range(3):
    trees = [caterpillar(g, DEPTH, []), caterpillar(g, 200, [])]
    loss = 0.0
    for tree in trees:
        toks = torch.randint(0, V, (256, BS), generator=g)
        aux = []
        root = model.encode(tree, toks, aux, {})
        y = torch.randint(0, NC, (BS,), generator=g)
        loss = loss + F.cross_entropy(model.cls(root), y)
        A = torch.stack(aux)
        ya = (y[None, :] + torch.arange(len(aux))[:, None]) % NC
        loss = loss + 0.1 * F.cross_entropy(model.cls(A).flatten(0, 1), ya.flatten())
    opt.zero_grad()
    loss.backward()
    opt.step()
    losses += [loss.detach(), root.detach().abs().mean()]
report(policy, [model], losses)
