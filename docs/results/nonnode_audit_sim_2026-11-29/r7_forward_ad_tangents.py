# Pattern: forward-mode AD (torch.autograd.forward_ad; a JVP regulariser). An op on a dual tensor
# computes its tangent by autograd's forward formula: ops of their own, called inside the op the
# registry runs. Under plain recompute (no host pool) they are passed through: tangents -- and what
# the formulas make and autograd saves for double backward -- are no nodes
# (Note [Tangents forward-mode AD makes]; only swap/hybrid or a host pool make them nodes).
import sys, os; sys.path.insert(0, os.path.dirname(__file__)); from _pre import *
import torch.autograd.forward_ad as fwAD
lin = torch.nn.Linear(512, 512)
x = torch.randn(2048, 512)
with fwAD.dual_level():
    xd = fwAD.make_dual(x, torch.randn_like(x))
    h = torch.relu(lin(xd))
    p, t = fwAD.unpack_dual(h)
    print("primal relu(lin(x))", tuple(p.shape), "node:", node(p), "| its tangent", tuple(t.shape), "node:", node(t))
