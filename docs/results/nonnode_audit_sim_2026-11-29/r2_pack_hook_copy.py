# Pattern: a saved_tensors_hooks pack hook that returns a copy (t.detach().clone(), t.to(float16),
# save_on_cpu's copy). The pack hook runs with grad mode off; what it returns is what autograd
# keeps until backward (activation-sized, one per saved tensor). Is the copy a node?
import sys, os; sys.path.insert(0, os.path.dirname(__file__)); from _pre import *
packed = []
def pack_clone(t):
    c = t.detach().clone(); packed.append(c); return c
def pack_fp16(t):
    c = t.to(torch.float16); packed.append(c); return c
lin = torch.nn.Linear(512, 512)
x = torch.randn(1024, 512)
for name, pk in (("clone", pack_clone), ("to(float16)", pack_fp16)):
    packed.clear()
    with torch.autograd.graph.saved_tensors_hooks(pk, lambda p: p.float()):
        h = lin(x).relu()          # addmm saves x (an input, no node); relu saves its output h (a node)
        y = torch.tanh(h)          # tanh saves its output y (a node)
    print(f"pack={name:12s} grad mode in pack: off | h node: {node(h)} | y node: {node(y)} | "
          f"packed copies: {[(tuple(c.shape), str(c.dtype).split('.')[1], node(c)) for c in packed]}")
    del h, y
