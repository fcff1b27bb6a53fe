# Pattern: an in-place op whose backward needs the pre-mutation input (clamp_, hardswish_, silu_,
# Hardswish/SiLU(inplace=True), clamp_ after a residual, ...) makes autograd clone "original self"
# inside its autograd kernel (aten::clone); the graph saves that clone for backward (it lives as
# long as the graph, activation-sized), and it is not a registry node.
import torch, pyalloc
pyalloc.install(device="cpu", budget="1GiB", policy="recompute")
from pyalloc import registry
reg = registry.active()
w = torch.randn(256, 256, requires_grad=True)
x = torch.randn(1024, 256)
h = x @ w
h.clamp_(min=-3, max=3)
s = h.grad_fn._saved_self            # the clone autograd made of h before clamp_ wrote it
print("h.clamp_():", h.grad_fn.name(), "| h node:", reg.node_of(h) is not None,
      "| saved original self", tuple(s.shape), "separate storage:", s.data_ptr() != h.data_ptr(), "node:", reg.node_of(s) is not None)
h2 = x @ w
torch.nn.functional.hardswish(h2, inplace=True)
s2 = h2.grad_fn._saved_self
print("hardswish(inplace=True):", h2.grad_fn.name(), "| h2 node:", reg.node_of(h2) is not None,
      "| saved original self", tuple(s2.shape), "separate storage:", s2.data_ptr() != h2.data_ptr(), "node:", reg.node_of(s2) is not None)
