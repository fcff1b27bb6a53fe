"""Random programs under the registry: evict anything at any time, read back the same bits.

tests/test_remat_random.py runs it as::

    python tests/programs/remat_random_programs.py --policy swap --examples 60

Hypothesis generates short programs of the ops that trip rematerialization (views and
transposes, in-place ops on fresh and on recorded storages, dropout and other random ops,
matmuls, reductions) with "evict everything the registry holds" steps between them. Each
runs twice: plainly, and under ``pyalloc.recompute(min_bytes=0)`` with the policy (swap
and hybrid with a 64 MiB host pool) and the evictions; every tensor it produced and the
gradients of a final backward must be equal bit for bit. At least one program must have
evicted something, and under swap and hybrid swapped something out. Prints ``ok`` at the
end.
"""
from __future__ import annotations

import argparse

import torch
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st

import pyalloc

UNARY = ["relu", "tanh", "exp_small", "dropout", "t", "slice", "mul2", "rand_add", "sum0"]
INPLACE = ["add_", "relu_", "mul_", "dropout_"]

STEP = st.one_of(
    st.tuples(st.just("op"), st.sampled_from(UNARY + ["matmul", "add"]), st.integers(0, 50),
              st.integers(0, 50)),
    st.tuples(st.just("inplace"), st.sampled_from(INPLACE), st.integers(0, 50),
              st.integers(0, 50)),
    st.tuples(st.just("overwrite"), st.sampled_from(["add_", "mul_"]), st.integers(1, 50),
              st.just(0)),
    st.tuples(st.just("evict"), st.just(""), st.just(0), st.just(0)),
)


def run(program, registry):
    """Runs ``program`` from a reseeded generator; with a registry, "evict" steps evict
    everything it holds. Returns every tensor made and the gradients of a final backward."""
    torch.manual_seed(1234)
    x = torch.randn(48, 48, requires_grad=True)
    w = torch.randn(48, 48, requires_grad=True)
    env = [x * 1.0]   # env[0] is never written in place (overwrite picks 1 and up)

    def apply(op, a, b):
        if op == "relu":
            return a.relu()
        if op == "tanh":
            return a.tanh()
        if op == "exp_small":
            return (a * 0.01).exp()
        if op == "dropout":
            return torch.nn.functional.dropout(a, 0.3)
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
        if op == "matmul":
            return a @ w if a.dim() == 2 and a.shape[-1] == 48 else a + 1
        if op == "add":
            return a + b if a.shape == b.shape else a - 1
        raise AssertionError(op)

    for kind, op, i, j in program:
        if kind == "evict":
            if registry is not None:
                registry.evict(list(registry.nodes))
            continue
        a, b = env[i % len(env)], env[j % len(env)]
        if kind == "overwrite":
            a = env[1 + i % (len(env) - 1)] if len(env) > 1 else env[0] * 1.0
            # In place on a tensor recorded ops may have read: they must be restored first
            # and stop being recomputable. (Autograd may refuse: the program is skipped.)
            if op == "add_":
                a.add_(0.25)
            else:
                a.mul_(0.75)
            env.append(a * 1.0)
            continue
        if kind == "inplace":
            # Only on fresh, non-leaf results nobody saved for backward (as autograd requires).
            base = apply("mul2", a, b)
            if op == "add_":
                base.add_(1.5)
            elif op == "relu_":
                base.relu_()
            elif op == "mul_":
                base.mul_(0.5)
            elif op == "dropout_":
                torch.nn.functional.dropout(base, 0.2, inplace=True)
            env.append(base)
        else:
            env.append(apply(op, a, b))
    loss = sum(t.float().sum() for t in env[1:]) if len(env) > 1 else env[0].sum()
    loss.backward()
    grads = [g.clone() for g in (x.grad, w.grad) if g is not None]
    return [t.detach().clone() for t in env] + grads


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--policy", choices=["recompute", "swap", "hybrid"], required=True)
    parser.add_argument("--examples", type=int, required=True,
                        help="how many programs Hypothesis generates")
    args = parser.parse_args()
    swap = {"policy": args.policy, "host_pool": 64 << 20}
    options = {} if args.policy == "recompute" else swap
    pyalloc.install(device="cpu", budget="1GiB")
    evicted = [0, 0]   # storages evicted, and of those swapped out (not dropped)

    @settings(max_examples=args.examples, deadline=None, suppress_health_check=list(HealthCheck))
    @given(st.lists(STEP, min_size=1, max_size=14))
    # A storage dropped while evicted, rebuilt for a reader's replay: the registry must let
    # go of the dead storage's address, which a new storage may take (it once mistook the
    # new storage for the old one, and replayed the wrong lineage into it).
    @example([("overwrite", "add_", 1, 0), ("evict", "", 0, 0), ("op", "relu", 0, 0),
              ("op", "relu", 0, 0), ("overwrite", "add_", 27, 0), ("op", "relu", 4, 0),
              ("evict", "", 0, 0)])
    def check(program):
        try:
            want = run(program, None)
        except RuntimeError as e:   # e.g. a leaf or a saved tensor written in place
            with pyalloc.recompute(min_bytes=0, **options) as registry:
                try:
                    run(program, registry)
                except RuntimeError as e2:
                    assert type(e2) is type(e), (e, e2)
                    assume(False)
                raise AssertionError(f"the plain run failed ({e}) but the registry run did not")
        with pyalloc.recompute(min_bytes=0, **options) as registry:
            got = run(program, registry)
        evicted[0] += registry.evictions
        evicted[1] += registry.swap_outs
        assert len(got) == len(want)
        for k, (g, w) in enumerate(zip(got, want)):
            assert torch.equal(g, w), (k, program)

    check()
    pyalloc.check_invariants()
    assert evicted[0] > 0, "no program evicted anything"
    assert evicted[1] > 0 or args.policy == "recompute", (
        f"policy {args.policy}: nothing was swapped out")
    print("ok")


if __name__ == "__main__":
    main()
