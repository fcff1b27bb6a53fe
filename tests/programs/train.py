"""Trains one of pyalloc.bench.models' tasks under pyalloc, for the training-equivalence tests.

The tests run it twice or more in fresh processes (tests/conftest.py's ``train``), once
unconstrained and once under a budget with a policy, and compare what it prints: every
loss and the digest of the final state must match bit for bit. Run as::

    python tests/programs/train.py --task cnn --budget 2GiB --steps 4 --batch 64 \\
        --options '{"policy": "recompute", "evict_strategy": "dtr"}'

It installs pyalloc with ``--device``, ``--budget`` and the install options given as a
JSON object, builds the task's model with PyTorch's generator seeded with 0 and
deterministic algorithms on, and trains ``--steps`` steps on one batch. It prints
``loss <float.hex()>`` per step, ``params <sha256>`` of the parameters, buffers and
optimizer state, what the ``--report-*`` flags ask for, then ``peak_reserved <bytes>`` and,
last, a JSON object of ``num_ooms`` and the registry's counters (``remat.*`` without the
prefix; none without a policy). The other flags change the run in the ways single tests
need; each says why.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import tempfile
import threading
import time
from typing import List, Union

import torch

import pyalloc
from digests import print_state_digest

OPTIMIZERS = {
    "sgd": lambda params: torch.optim.SGD(params, lr=0.01, momentum=0.9),
    # Its temporaries are made inside step(): long-lived requests (tests/test_lifetime.py).
    "adam-foreach": lambda params: torch.optim.Adam(params, lr=1e-3, foreach=True),
}


def budget_arg(text: str) -> Union[int, str]:
    """A budget in bytes (digits) or as install() reads a string ("2GiB", "50%")."""
    return int(text) if text.isdigit() else text


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", required=True, help="a name in pyalloc.bench.models.TASKS")
    parser.add_argument("--budget", type=budget_arg, required=True)
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--batch", type=int, required=True)
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--options", type=json.loads, default={},
                        help="further install() options, a JSON object")
    parser.add_argument("--optimizer", choices=sorted(OPTIMIZERS), default="sgd",
                        help="sgd: SGD with momentum (the default)")
    parser.add_argument("--no-cudnn", action="store_true",
                        help="turn cuDNN off: it picks its convolution algorithm by the "
                             "workspace it can get, so a tight budget changes its rounding")
    parser.add_argument("--record-op-trace", action="store_true",
                        help="record a trace with stacks through the run: pyalloc's op "
                             "tagging is a Python dispatch mode of the program's own")
    parser.add_argument("--copy-delay-us", type=int, default=None,
                        help="slow both swap streams by this much per copy and let the "
                             "registry measure them again (hybrid sees a slow copy engine)")
    parser.add_argument("--refuse-copies", action="store_true",
                        help="refuse the next copy every 20 ms, from a thread of its own")
    parser.add_argument("--shake", action="store_true",
                        help="after each forward, ask four times for a run 1 MiB larger than "
                             "the largest free block, which only moving storages can open; "
                             "prints 'moved <asked> <relocations counted>'")
    parser.add_argument("--report-registry", action="store_true",
                        help="check the registry's invariants after training and print "
                             "'nodes after <n>'")
    parser.add_argument("--report-static-bytes", action="store_true",
                        help="print 'static_bytes' (what no policy can evict, each storage "
                             "once) and 'allocated_peak'")
    parser.add_argument("--report-floor", action="store_true",
                        help="under a policy: print 'floor_bytes', the least memory any choice "
                             "of victims needs (bench_remat's floor, Registry.floor_probe)")
    return parser.parse_args()


def refuse_copies_now_and_then(engine: pyalloc.Engine) -> None:
    def refuse() -> None:
        while True:
            engine.fail_copies(1)
            time.sleep(0.02)

    threading.Thread(target=refuse, daemon=True).start()


def shake_after_each_forward(engine: pyalloc.Engine) -> List[int]:
    """Moves live storages after every forward, when the activations backward needs are
    resident; returns a one-element list that counts the storages moved."""
    from pyalloc.bench import models

    moved = [0]
    loss_of = models.Task.loss

    def shaken_loss(self, model, x, y):
        out = loss_of(self, model, x, y)
        for _ in range(4):
            snapshot = engine.snapshot()
            free = [block["size"] for segment in snapshot["segments"]
                    if segment["segment_type"] == "large"
                    for block in segment["blocks"] if block["state"] == "inactive"]
            moved[0] += engine.compact(max(free, default=0) + (1 << 20))
        return out

    models.Task.loss = shaken_loss
    return moved


def static_bytes(model, optimizer, x, y) -> int:
    """The bytes no policy can evict, each storage once (a head may share the embedding's
    weight): parameters, buffers, gradients, optimizer state and the batch."""
    tensors = (list(model.parameters()) + list(model.buffers())
               + [p.grad for p in model.parameters() if p.grad is not None]
               + [value for state in optimizer.state.values() for value in state.values()
                  if isinstance(value, torch.Tensor)]
               + [x, y])
    by_storage = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors}
    return sum(by_storage.values())


def main() -> None:
    args = parse_args()
    pyalloc.install(device=args.device, budget=args.budget, **args.options)
    from pyalloc.bench.models import TASKS

    torch.manual_seed(0)
    torch.use_deterministic_algorithms(True)
    if args.no_cudnn:
        torch.backends.cudnn.enabled = False
    if args.record_op_trace:
        # Entered for the rest of the run, like a program that traces all of itself.
        op_trace = pyalloc.record_trace(os.path.join(tempfile.mkdtemp(), "t.json.gz"),
                                        stacks=True)
        op_trace.__enter__()
    if args.copy_delay_us is not None:
        from pyalloc import registry

        engine = pyalloc._engine(None)
        for to_host in (True, False):
            engine.set_stream_delay(engine.swap_stream(to_host), args.copy_delay_us)
        registry.active().calibrate_copies()
    if args.refuse_copies:
        refuse_copies_now_and_then(pyalloc._engine(None))
    if args.shake:
        moved = shake_after_each_forward(pyalloc._engine(None))

    task = TASKS[args.task]
    model = task.build().to(args.device)
    optimizer = OPTIMIZERS[args.optimizer](model.parameters())
    x, y = task.batch(args.batch, torch.Generator().manual_seed(1))
    x, y = x.to(args.device), y.to(args.device)
    probe = contextlib.nullcontext()
    if args.report_floor:
        from pyalloc import registry

        probe = registry.active().floor_probe()
    with probe as floor:
        for _ in range(args.steps):
            optimizer.zero_grad(set_to_none=True)
            loss = task.loss(model, x, y)
            loss.backward()
            optimizer.step()
            print("loss", loss.item().hex())
    if args.report_floor:
        print("floor_bytes", floor["bytes"])
    print_state_digest(model, optimizer)

    if args.report_registry:
        from pyalloc import registry

        registry.active().check_invariants()
        print("nodes after", registry.active().stats()["nodes"])
    if args.report_static_bytes:
        print("static_bytes", static_bytes(model, optimizer, x, y))
        print("allocated_peak", pyalloc.memory_stats()["allocated_bytes.all.peak"])
    if args.shake:
        print("moved", moved[0], pyalloc.memory_stats()["num_relocations"])
    pyalloc.check_invariants()
    stats = pyalloc.memory_stats()
    print("peak_reserved", stats["reserved_bytes.all.peak"])
    print(json.dumps({"num_ooms": stats["num_ooms"],
                      **{k[6:]: v for k, v in stats.items() if k.startswith("remat.")}}))


if __name__ == "__main__":
    main()
