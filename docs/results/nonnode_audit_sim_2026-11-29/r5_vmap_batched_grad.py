# Pattern: backward passes batched by PyTorch's legacy vmap: torch.autograd.grad(...,
# is_grads_batched=True) and torch.autograd.functional.jacobian(vectorize=True) (which uses it).
# Every op of such a pass sees BatchedTensor wrappers (DispatchKey::Batched), which the registry
# treats as foreign: nothing the pass makes is a node -- with create_graph=True that includes what
# the pass saves for the second backward (cummax_gradbatch: 109 MiB at the peak).
# (torch.func.vmap's results, by contrast, were nodes here.)
import sys, os; sys.path.insert(0, os.path.dirname(__file__)); from _pre import *
import torch.autograd.functional as AF
lin1, lin2 = torch.nn.Linear(256, 512), torch.nn.Linear(512, 4)
x = torch.randn(1024, 256, requires_grad=True)
h = torch.tanh(lin1(x)); out = lin2(h)
go = torch.eye(4)[:, None, :].expand(4, 1024, 4)
(gx,) = torch.autograd.grad(out, x, grad_outputs=go, is_grads_batched=True, create_graph=True)
g0 = torch.autograd.grad(out, x, grad_outputs=go[0], create_graph=True, retain_graph=True)[0]
print("forward h node:", node(h))
print("autograd.grad(is_grads_batched=True, create_graph=True): gx", tuple(gx.shape), "node:", node(gx))
print("autograd.grad(one grad_output, create_graph=True):      g0", tuple(g0.shape), "node:", node(g0))
J = AF.jacobian(lambda xi: torch.tanh(lin1(xi)), x[:4], create_graph=True, vectorize=True)
Jl = AF.jacobian(lambda xi: torch.tanh(lin1(xi)), x[:4], create_graph=True, vectorize=False)
print("functional.jacobian(vectorize=True):  J", tuple(J.shape), "node:", node(J))
print("functional.jacobian(vectorize=False): J", tuple(Jl.shape), "node:", node(Jl))
