# Pattern: an op on a __torch_dispatch__ wrapper subclass (torchao-style float8/scaled tensors) that
# returns a plain tensor -- here inside a custom autograd.Function, as Float8Linear does. The op
# takes a Python subclass, so the registry does not record it (foreign), and the subclass's inner
# ops run below the registry: the plain, activation-sized result is no node (under recompute;
# Note [What a subclass's op returns] makes it one only under swap/hybrid).
import sys, os; sys.path.insert(0, os.path.dirname(__file__)); from _pre import *
from torch.utils._pytree import tree_map
class Scaled(torch.Tensor):
    @staticmethod
    def __new__(cls, data, scale):
        return torch.Tensor._make_wrapper_subclass(cls, data.shape, dtype=torch.float32, device=data.device)
    def __init__(self, data, scale): self.data_, self.scale = data, scale
    def __tensor_flatten__(self): return ["data_", "scale"], None
    @staticmethod
    def __tensor_unflatten__(inner, meta, *a): return Scaled(inner["data_"], inner["scale"])
    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        if func is torch.ops.aten.t.default: return Scaled(args[0].data_.t(), args[0].scale)
        if func is torch.ops.aten.detach.default: return Scaled(args[0].data_.detach(), args[0].scale)
        deq = lambda t: t.data_.float() * t.scale if isinstance(t, Scaled) else t
        return func(*tree_map(deq, args), **tree_map(deq, kwargs or {}))
def to_scaled(x):
    s = x.detach().abs().amax() / 100
    return Scaled((x / s).to(torch.bfloat16), s)
class ScaledMM(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w):
        xs, ws = to_scaled(x), to_scaled(w)
        ctx.save_for_backward(x, w)
        return torch.mm(xs, ws.t())
    @staticmethod
    def backward(ctx, g):
        x, w = ctx.saved_tensors
        return g @ w, g.t() @ x
class PlainMM(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w):
        ctx.save_for_backward(x, w)
        return torch.mm(x, w.t())
    @staticmethod
    def backward(ctx, g):
        x, w = ctx.saved_tensors
        return g @ w, g.t() @ x
w = torch.randn(512, 512, requires_grad=True)
x = torch.tanh(torch.randn(2048, 512) @ w)      # an activation (a node)
y = ScaledMM.apply(x, w)
z = PlainMM.apply(x, w)
print("input x node:", node(x))
print("ScaledMM (mm on a wrapper subclass) result", tuple(y.shape), type(y).__name__, "node:", node(y))
print("PlainMM  (same Function, plain mm) result  ", tuple(z.shape), type(z).__name__, "node:", node(z))
