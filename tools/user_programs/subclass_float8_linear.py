# Untuned: float8 training as torchao's Float8Linear does it, written by hand. A __torch_dispatch__
# wrapper subclass ScaledTensor (made by _make_wrapper_subclass, __tensor_flatten__/__tensor_unflatten__)
# holds float8_e4m3fn (gradients: e5m2) data and a reciprocal scale; t/transpose/view/detach/clone
# stay scaled, mm/addmm on it dequantize and matmul, anything else dequantizes. A ToScaled
# autograd.Function casts with a dynamic amax scale (straight-through backward, optionally a
# delayed scale from an amax history buffer updated in place), and Float8MM (an autograd.Function)
# saves both ScaledTensors for backward and casts the incoming gradient to e5m2 there. Every Linear
# of a small pre-norm transformer LM's MLPs and projections is swapped for Float8Linear (plain
# master weights); AdamW, clip_grad_norm_, 4 steps.
import os, torch, torch.nn as nn, torch.nn.functional as F
from torch.utils._pytree import tree_map
from common import setup, report
policy = setup()
torch.use_deterministic_algorithms(True)
aten = torch.ops.aten
E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2
FMAX = {E4M3: torch.finfo(E4M3).max, E5M2: torch.finfo(E5M2).max}

class ScaledTensor(torch.Tensor):
    @staticmethod
    def __new__(cls, data, inv_scale, orig_dtype):
        return torch.Tensor._make_wrapper_subclass(cls, data.shape, strides=data.stride(), dtype=orig_dtype,
                                                   device=data.device, requires_grad=False)
    def __init__(self, data, inv_scale, orig_dtype):
        self._data, self._inv_scale, self._orig_dtype = data, inv_scale, orig_dtype
    def __repr__(self):
        return f"ScaledTensor({self._data.dtype}, shape={tuple(self.shape)}, inv_scale={self._inv_scale.item():.3g})"
    def __tensor_flatten__(self):
        return ["_data", "_inv_scale"], {"orig_dtype": self._orig_dtype}
    @staticmethod
    def __tensor_unflatten__(inner, meta, outer_size, outer_stride):
        return ScaledTensor(inner["_data"], inner["_inv_scale"], meta["orig_dtype"])
    def dequant(self):
        return self._data.to(self._orig_dtype) * self._inv_scale
    __torch_function__ = torch._C._disabled_torch_function_impl
    KEEP = {aten.t.default, aten.transpose.int, aten.view.default, aten._unsafe_view.default, aten.detach.default,
            aten.clone.default, aten.alias.default, aten.reshape.default}
    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in cls.KEEP:
            a = args[0]
            return ScaledTensor(func(a._data, *args[1:], **kwargs), a._inv_scale, a._orig_dtype)
        if func is aten.mm.default:
            a, b = args
            return scaled_mm(a, b)
        if func is aten.addmm.default:
            bias, a, b = args
            return scaled_mm(a, b) + bias
        unwrap = lambda t: t.dequant() if isinstance(t, ScaledTensor) else t
        return func(*tree_map(unwrap, args), **tree_map(unwrap, kwargs))

def scaled_mm(a, b):
    # emulated _scaled_mm: multiply the float8 payloads upcast, then apply both scales
    ad = a._data.to(torch.float32) if isinstance(a, ScaledTensor) else a
    bd = b._data.to(torch.float32) if isinstance(b, ScaledTensor) else b
    out = torch.mm(ad, bd)
    if isinstance(a, ScaledTensor): out = out * a._inv_scale
    if isinstance(b, ScaledTensor): out = out * b._inv_scale
    return out

def to_scaled(x, dtype, amax=None):
    if amax is None: amax = x.detach().abs().amax()
    scale = FMAX[dtype] / amax.double().clamp(min=1e-12)
    scale = scale.to(torch.float32)
    data = (x * scale).clamp(-FMAX[dtype], FMAX[dtype]).to(dtype)
    return ScaledTensor(data, scale.reciprocal(), x.dtype)

class ToScaled(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, history):
        amax = x.abs().amax()
        if history is not None:  # delayed scaling: scale from the history, then record this amax
            use = torch.maximum(history.max(), amax) if int(os.environ.get("DELAYED", "0")) else amax
            history.copy_(torch.roll(history, 1)); history[0] = amax
        else: use = amax
        return to_scaled(x, E4M3, use)
    @staticmethod
    def backward(ctx, g):
        return (g.dequant() if isinstance(g, ScaledTensor) else g), None

class Float8MM(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x_s, w_s):
        ctx.save_for_backward(x_s, w_s)
        return torch.mm(x_s, w_s.t())
    @staticmethod
    def backward(ctx, g):
        x_s, w_s = ctx.saved_tensors
        g_s = to_scaled(g, E5M2)
        grad_x = torch.mm(g_s, w_s)
        grad_w = torch.mm(g_s.t(), x_s)
        return grad_x, grad_w

class Float8Linear(nn.Linear):
    def __init__(s, i, o, bias=True):
        super().__init__(i, o, bias)
        s.register_buffer("x_amax_history", torch.zeros(16))
        s.register_buffer("w_amax_history", torch.zeros(16))
    def forward(s, x):
        lead = x.shape[:-1]
        x2 = x.reshape(-1, x.shape[-1])
        x_s = ToScaled.apply(x2, s.x_amax_history)
        w_s = ToScaled.apply(s.weight, s.w_amax_history)
        y = Float8MM.apply(x_s, w_s)
        if s.bias is not None: y = y + s.bias
        return y.view(*lead, -1)
    @classmethod
    def from_float(cls, lin):
        new = cls(lin.in_features, lin.out_features, lin.bias is not None)
        with torch.no_grad():
            new.weight.copy_(lin.weight)
            if lin.bias is not None: new.bias.copy_(lin.bias)
        return new

def swap_linears(m):
    for name, c in m.named_children():
        if isinstance(c, nn.Linear) and c.in_features % 16 == 0 and c.out_features % 16 == 0:
            setattr(m, name, Float8Linear.from_float(c))
        else: swap_linears(c)
    return m

class Block(nn.Module):
    def __init__(s, d, h):
        super().__init__()
        s.h = h; s.n1 = nn.LayerNorm(d); s.qkv = nn.Linear(d, 3 * d); s.o = nn.Linear(d, d)
        s.n2 = nn.LayerNorm(d); s.fc1 = nn.Linear(d, 4 * d); s.fc2 = nn.Linear(4 * d, d)
    def forward(s, x):
        B, T, D = x.shape
        q, k, v = s.qkv(s.n1(x)).view(B, T, 3, s.h, D // s.h).permute(2, 0, 3, 1, 4)
        att = (q @ k.transpose(-2, -1)) * (D // s.h) ** -0.5
        att = att.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf")).softmax(-1)
        x = x + s.o((att @ v).transpose(1, 2).reshape(B, T, D))
        return x + s.fc2(F.gelu(s.fc1(s.n2(x))))
class LM(nn.Module):
    def __init__(s, V=512, d=128, L=4, h=4, T=128):
        super().__init__()
        s.emb = nn.Embedding(V, d); s.pos = nn.Parameter(torch.randn(T, d) * 0.02)
        s.blocks = nn.ModuleList(Block(d, h) for _ in range(L)); s.nf = nn.LayerNorm(d); s.head = nn.Linear(d, V, bias=False)
    def forward(s, t):
        x = s.emb(t) + s.pos[: t.shape[1]]
        for b in s.blocks: x = b(x)
        return s.head(s.nf(x))
model = swap_linears(LM())
opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
g = torch.Generator().manual_seed(1)
data = torch.randint(0, 512, (4, 32, 129), generator=g)
losses = []
for step in range(4):
    t = data[step]
    logits = model(t[:, :-1])
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), t[:, 1:].reshape(-1))
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    losses.append(loss.detach())
report(policy, [model], losses)
