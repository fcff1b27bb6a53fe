"""Random programs under the registry: evict anything at any time, read back the same bits.

tests/test_remat_random.py runs it as::

    python tests/programs/remat_random_programs.py --policy swap --examples 60

Hypothesis generates short programs of the ops that trip rematerialization, and runs each
as two training iterations (forward, backward, an SGD step on the parameters) plainly and
under ``pyalloc.recompute(min_bytes=0)`` with the policy (swap and hybrid with a 64 MiB host
pool). Every tensor the program made, the gradients and the parameters after each
iteration must be equal bit for bit (NaN included: bits, not values). At least one program
must have evicted something, and under swap and hybrid swapped something out. Prints
``ok`` at the end.

The vocabulary is what user programs do to activations (every op reads one or two earlier
results, chosen by the program):

* elementwise, reductions, softmax and norms, matmuls, casts to other dtypes and back,
  complex views and conjugate views (the lazy conjugate and negative bits), strided views (``t``, slices, ``as_strided``, ``unfold``), ``cat`` and
  ``stack``, ops with two results (``max`` along a dimension, ``var_mean``, ``sort``), and
  integer indices made from activations (``topk``, ``argsort``, boolean masks) used by
  ``gather``, ``scatter`` and ``index_put_``;
* random ops (dropout, ``rand_like``, ``bernoulli``, ``normal_``, ``multinomial``), which a
  replay must draw again from the same generator state;
* in-place ops on fresh results and on views of them; buffers made by ``zeros`` or
  ``empty`` and assembled by writes into slices; in-place writes of earlier results that
  recorded ops read ("overwrite": autograd may refuse them, and the program is skipped when
  it does, under both runs alike);
* ops under ``no_grad`` on activations, a custom ``autograd.Function``, a straight-through
  estimator, non-reentrant checkpointing, a parameter rebound by ``.data =``; a gradient
  penalty (``autograd.grad(create_graph=True)``, then a double backward) and gradients of
  activations kept by ``retain_grad``;
* "drop": the program lets go of a result, so its storage dies as lineage when nothing
  else holds it; "evict"/"evict_some": everything the registry holds, or every other node,
  is evicted at once; "evict_in_backward": a gradient hook evicts everything during
  backward.
"""
from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, assume, example, given, seed, settings
from hypothesis import strategies as st
from torch.utils.checkpoint import checkpoint

import pyalloc

N = 48  # every result starts as N x N float32 (--size); ops that change the shape restore it

UNARY = ["relu", "tanh", "exp_small", "dropout", "t", "slice", "mul2", "rand_add", "sum0",
         "sigmoid", "softmax", "log_softmax", "cumsum", "layer_norm", "batch_norm",
         "double", "bfloat16", "complex", "as_strided", "unfold", "max_dim", "var_mean",
         "sort", "bernoulli", "normal_", "multinomial", "ste", "function", "checkpoint",
         "mul_p", "contiguous_t", "expand", "chunk", "conj", "conj_imag"]
BINARY = ["matmul", "add", "cat", "stack", "where", "topk_scatter", "argsort_gather",
          "index_put_", "assemble_zeros", "assemble_empty"]
INPLACE = ["add_", "relu_", "mul_", "dropout_", "slice_mul_", "t_slice_add_",
           "masked_fill_", "clamp_"]
OVERWRITE = ["add_", "mul_", "slice_add_", "copy_"]

STEP = st.one_of(
    st.tuples(st.just("op"), st.sampled_from(UNARY + BINARY), st.integers(0, 50),
              st.integers(0, 50)),
    st.tuples(st.just("inplace"), st.sampled_from(INPLACE), st.integers(0, 50),
              st.integers(0, 50)),
    st.tuples(st.just("overwrite"), st.sampled_from(OVERWRITE), st.integers(1, 50),
              st.integers(0, 50)),
    st.tuples(st.just("nograd"), st.sampled_from(UNARY[:12] + BINARY[:5]), st.integers(0, 50),
              st.integers(0, 50)),
    st.tuples(st.just("drop"), st.just(""), st.integers(1, 50), st.just(0)),
    st.tuples(st.just("rebind"), st.just(""), st.just(0), st.just(0)),
    st.tuples(st.sampled_from(["grad_of", "retain_grad"]), st.just(""), st.integers(0, 50),
              st.integers(0, 50)),
    st.tuples(st.sampled_from(["evict", "evict_some", "evict_in_backward"]), st.just(""),
              st.integers(0, 50), st.just(0)),
)


class Square(torch.autograd.Function):
    """A user's Function: saves its input and its output for backward."""

    @staticmethod
    def forward(ctx, a):
        y = a * a
        ctx.save_for_backward(a, y)
        return y

    @staticmethod
    def backward(ctx, g):
        a, y = ctx.saved_tensors
        return g * 2 * a + g * (y * 0)


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    return torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))


def square(t: torch.Tensor) -> torch.Tensor:
    """Any result back to N x N float32 (a copy when it must change)."""
    if t.dtype != torch.float32:
        t = t.float()
    if t.shape == (N, N):
        return t
    flat = t.reshape(-1)
    reps = -(-N * N // flat.numel())
    return flat.repeat(reps)[:N * N].reshape(N, N)


def run(program, registry):
    """Runs ``program`` as two iterations from a reseeded generator; with a registry the
    eviction steps evict. Returns every tensor made, the gradients and the parameters."""
    torch.manual_seed(1234)
    x = torch.randn(N, N, requires_grad=True)
    w = (torch.randn(N, N) / 7).requires_grad_()
    p = torch.rand(N, N).add_(0.5).requires_grad_()   # the parameter "rebind" rebinds
    running_mean, running_var = torch.zeros(N), torch.ones(N)
    out = []

    def evict(which):
        if registry is None:
            return
        handles = list(registry.nodes)
        registry.evict(handles if which == "evict" else handles[::2])

    def apply(op, a, b):
        if op == "relu":
            return a.relu()
        if op == "tanh":
            return a.tanh()
        if op == "exp_small":
            return (a * 0.01).exp()
        if op == "dropout":
            return F.dropout(a, 0.3)
        if op == "t":
            return a.t()
        if op == "slice":
            return a[1:, :] if a.dim() == 2 and a.shape[0] > 2 else a * 1.0
        if op == "mul2":
            return a * 2
        if op == "rand_add":
            return a + torch.rand_like(a)
        if op == "sum0":
            return a.sum(0, keepdim=True).expand_as(a) if a.dim() == 2 else a
        if op == "sigmoid":
            return torch.sigmoid(a)
        if op == "softmax":
            return a.softmax(-1)
        if op == "log_softmax":
            return F.log_softmax(a, 0)
        if op == "cumsum":
            return a.cumsum(-1) * 0.1
        if op == "layer_norm":
            return F.layer_norm(a, a.shape[-1:])
        if op == "batch_norm":   # writes the running statistics, buffers the result reads not
            return F.batch_norm(square(a), running_mean, running_var, training=True)
        if op == "double":
            return (a.double() * 1.5).tanh().float()
        if op == "bfloat16":
            return (a.to(torch.bfloat16) + 1).float()
        if op == "complex":
            c = torch.view_as_complex(square(a).reshape(N, N // 2, 2).contiguous())
            return torch.view_as_real(c * (0.5 + 0.25j)).reshape(N, N)
        if op == "conj":   # a view with the lazy conjugate bit, read by an op
            c = torch.view_as_complex(square(a).reshape(N, N // 2, 2).contiguous())
            return torch.view_as_real(c.conj() * (1.5 - 0.5j)).reshape(N, N)
        if op == "conj_imag":   # the negative bit: the imaginary part of a conjugate view
            c = torch.view_as_complex(square(a).reshape(N, N // 2, 2).contiguous())
            return (c.conj().imag * 2).repeat(1, 2)
        if op == "as_strided":   # every other column of a contiguous copy, twice
            s = square(a).contiguous()
            v = s.as_strided((N, N // 2), (N, 2))
            return torch.cat([v, v * 2], 1)
        if op == "unfold":
            return square(a).unfold(1, 4, 4).sum(-1).repeat(1, 4)
        if op == "max_dim":
            v, i = a.max(-1, keepdim=True)
            return v.expand_as(a) + i.float() * 0.01
        if op == "var_mean":
            v, m = torch.var_mean(a, -1, keepdim=True)
            return (a - m) / (v + 1).sqrt()
        if op == "sort":
            return a.sort(-1).values
        if op == "bernoulli":
            return a * torch.bernoulli(torch.full_like(a, 0.5))
        if op == "normal_":
            return a + torch.empty_like(a).normal_()
        if op == "multinomial":
            s = square(a)
            idx = torch.multinomial(s.softmax(-1), 4, replacement=True)
            return s.gather(1, idx).repeat(1, N // 4)
        if op == "ste":   # straight through: forward rounds, backward passes
            return a + (torch.round(a * 4) / 4 - a).detach()
        if op == "function":
            return Square.apply(a)
        if op == "checkpoint":
            return checkpoint(lambda t: (square(t) @ w).relu(), a, use_reentrant=False)
        if op == "mul_p":
            return square(a) * p
        if op == "contiguous_t":
            return a.t().contiguous()
        if op == "expand":
            return a[:1].expand_as(a) + a
        if op == "chunk":
            c0, c1 = square(a).chunk(2, 0)
            return torch.cat([c1 * 2, c0], 0)
        a, b = square(a), square(b)
        if op == "matmul":
            return a @ w
        if op == "add":
            return a + b
        if op == "cat":
            return torch.cat([a, b], 1)[:, ::2]
        if op == "stack":
            return torch.stack([a, b]).mean(0)
        if op == "where":
            return torch.where(a > 0, a, b)
        if op == "topk_scatter":   # indices made from one activation pick from another
            idx = b.topk(8, dim=1).indices
            return torch.zeros_like(a).scatter(1, idx, a.gather(1, idx))
        if op == "argsort_gather":
            return a.gather(1, b.argsort(1))
        if op == "index_put_":   # a boolean mask: nonzero inside, a data-dependent shape
            buf = a * 1.0
            mask = b > 0
            buf[mask] = (b * 2)[mask]
            return buf
        if op == "assemble_zeros":   # a buffer filled by writes into its slices
            buf = torch.zeros(N, N)
            buf[: N // 2] = a[: N // 2]
            buf[N // 2:] = b[N // 2:] * 2
            return buf
        if op == "assemble_empty":
            buf = torch.empty(N, N)
            buf.copy_(a)
            buf[:, : N // 3].mul_(0.5)
            return buf + b
        raise AssertionError(op)

    def inplace(op, a):
        base = square(a) * 2   # fresh: nobody saved it for backward yet
        if op == "add_":
            base.add_(1.5)
        elif op == "relu_":
            base.relu_()
        elif op == "mul_":
            base.mul_(0.5)
        elif op == "dropout_":
            F.dropout(base, 0.2, inplace=True)
        elif op == "slice_mul_":
            base[:, : N // 2].mul_(0.5)
        elif op == "t_slice_add_":
            base.t()[::2].add_(1.0)
        elif op == "masked_fill_":
            base.masked_fill_(base > 1, 1.0)
        elif op == "clamp_":
            base.clamp_(-1, 1)
        return base

    for iteration in range(2):
        env = [x * 1.0]   # env[0] is never written in place nor dropped
        hooks, retained = [], []
        for kind, op, i, j in program:
            if kind in ("evict", "evict_some"):
                evict(kind)
                continue
            live = [k for k, t in enumerate(env) if t is not None]
            a, b = env[live[i % len(live)]], env[live[j % len(live)]]
            if kind == "evict_in_backward":
                if a.requires_grad:
                    hooks.append(a.register_hook(lambda g: evict("evict")))
            elif kind == "drop":
                k = i % len(env)
                if k:
                    env[k] = None
            elif kind == "grad_of":
                # A gradient penalty: a gradient with a graph of its own, in the loss (its
                # backward is a double backward through a's history).
                if a.requires_grad:
                    g, = torch.autograd.grad((a * b).sum(), x, create_graph=True,
                                             allow_unused=True)
                    if g is not None:
                        env.append(g * 0.1)
            elif kind == "retain_grad":
                if a.requires_grad and not a.is_leaf:
                    a.retain_grad()
                    retained.append(a)
            elif kind == "rebind":
                p.data = p.data * 0.75 + 0.25
            elif kind == "overwrite":
                writable = [k for k in live if k]
                if not writable:
                    continue
                t = env[writable[i % len(writable)]]
                # In place on a result recorded ops may have read: they must be restored
                # first and stop being recomputable. (Autograd may refuse: skipped.)
                if op == "add_":
                    t.add_(0.25)
                elif op == "mul_":
                    t.mul_(0.75)
                elif op == "slice_add_":
                    t[: N // 4].add_(0.5)
                elif op == "copy_":
                    if t.shape == b.shape and t.dtype == b.dtype:
                        t.copy_(b)
                env.append(t * 1.0)
            elif kind == "inplace":
                env.append(inplace(op, a))
            elif kind == "nograd":
                with torch.no_grad():
                    env.append(apply(op, a, b))
            else:
                env.append(apply(op, a, b))
        kept = [t for t in env if t is not None]
        loss = sum(t.float().sum() for t in kept) + (x * 0).sum()
        loss.backward()
        for h in hooks:
            h.remove()
        out += [t.detach().clone() for t in kept]
        out += [t.grad.clone() for t in [x, w, p] + retained if t.grad is not None]
        with torch.no_grad():
            for t in (w, p):
                if t.grad is not None:
                    t.sub_(t.grad.clamp(-1, 1) * 0.01)
                    t.grad = None
            x.grad = None
        out += [w.detach().clone(), p.detach().clone(), running_mean.clone(), running_var.clone()]
    return out


def main() -> None:
    global N
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--policy", choices=["recompute", "swap", "hybrid"], required=True)
    parser.add_argument("--examples", type=int, required=True,
                        help="how many programs Hypothesis generates")
    parser.add_argument("--seed", type=int, default=None,
                        help="Hypothesis's seed (default: its own, derandomized)")
    parser.add_argument("--size", type=int, default=N,
                        help="the side of the square results (default %(default)s)")
    parser.add_argument("--budgets", type=str, default="",
                        help="comma-separated budgets in MiB to draw from, besides none: the "
                             "engine then evicts by itself too (a program that runs out of "
                             "memory cleanly is skipped)")
    args = parser.parse_args()
    N = args.size
    budgets = [None] + [int(float(b) * (1 << 20)) for b in args.budgets.split(",") if b]
    swap = {"policy": args.policy, "host_pool": 64 << 20}
    options = {} if args.policy == "recompute" else swap
    pyalloc.install(device="cpu", budget="1GiB")
    evicted = [0, 0, 0]   # storages evicted, of those swapped out (not dropped); recomputed
    compared, refused, ooms = [0], {}, [0]
    engine = pyalloc._engine(None)   # programs compared; plain PyTorch's refusals, by message

    @settings(max_examples=args.examples, deadline=None, derandomize=args.seed is None,
              suppress_health_check=list(HealthCheck), database=None)
    @given(st.lists(STEP, min_size=1, max_size=16), st.sampled_from(budgets))
    # A storage dropped while evicted, rebuilt for a reader's replay: the registry must let
    # go of the dead storage's address, which a new storage may take (it once mistook the
    # new storage for the old one, and replayed the wrong lineage into it).
    @example([("overwrite", "add_", 1, 0), ("evict", "", 0, 0), ("op", "relu", 0, 0),
              ("op", "relu", 0, 0), ("overwrite", "add_", 27, 0), ("op", "relu", 4, 0),
              ("evict", "", 0, 0)], None)
    # A parameter rebound by `.data =` after an op read it, then that op's result evicted:
    # the replay must read what the op read (Note [Rebinding a tensor's data]).
    @example([("op", "mul_p", 0, 0), ("rebind", "", 0, 0), ("evict", "", 0, 0)], None)
    def check(program, budget):
        try:
            want = run(program, None)
        except RuntimeError as e:   # e.g. a leaf or a saved tensor written in place
            reason = str(e).split("\n")[0][:90]
            refused[reason] = refused.get(reason, 0) + 1
            with pyalloc.recompute(min_bytes=0, **options) as registry:
                try:
                    run(program, registry)
                except RuntimeError as e2:
                    assert type(e2) is type(e), (e, e2)
                    assume(False)
                raise AssertionError(f"the plain run failed ({e}) but the registry run did not")
        with pyalloc.recompute(min_bytes=0, **options) as registry:
            engine.empty_cache()   # what the plain run left cached would count against it
            engine.set_budget(budget or (1 << 30))
            try:
                got = run(program, registry)
            except torch.OutOfMemoryError:
                # A clean out-of-memory error is an allowed outcome. (Not assume(): under
                # swap and hybrid whether it comes depends on the copy thread's timing.)
                ooms[0] += 1
                return
            finally:
                engine.set_budget(1 << 30)
        evicted[0] += registry.evictions
        evicted[1] += registry.swap_outs
        evicted[2] += registry.recomputes
        compared[0] += 1
        assert len(got) == len(want), (len(got), len(want), program)
        for k, (g, w) in enumerate(zip(got, want)):
            assert same_bits(g, w), (k, program)

    if args.seed is not None:
        check = seed(args.seed)(check)
    check()
    pyalloc.check_invariants()
    assert evicted[0] > 0, "no program evicted anything"
    assert evicted[1] > 0 or args.policy == "recompute", (
        f"policy {args.policy}: nothing was swapped out")
    for reason, n in sorted(refused.items(), key=lambda r: -r[1]):
        print(f"skipped {n}: plain PyTorch refused: {reason}")
    print(f"compared {compared[0]} programs: {evicted[0]} evictions ({evicted[1]} swapped "
          f"out), {evicted[2]} recomputations; {ooms[0]} out of memory (skipped)")
    print("ok")


if __name__ == "__main__":
    main()
