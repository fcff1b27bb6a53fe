"""Trains a task with the INPLACE_UPDATE mode on or off, for tests/test_inplace.py.

Run as::

    python tests/programs/inplace_update_training.py --task cnn --batch 32 \\
        --optimizer adam --inplace-update true

It trains six steps on one batch and prints ``loss <float.hex()>`` per step, ``params
<sha256>`` of the parameters, buffers and optimizer state, ``largest allocation in step
[<bytes per step>]`` (the largest allocation inside ``optimizer.step()``, from the
engine's trace), ``same addresses <bool>`` (parameters, gradients and state stay where
they were from the second step on), ``in persistent <bool>`` (they sit in persistent
segments) and ``persistent segments hold no activation <bool>`` (those segments hold
exactly them and the mode's scratch).
"""
from __future__ import annotations

import argparse

import torch

import pyalloc
from digests import print_state_digest

OPTIMIZERS = {
    "sgd": lambda model: torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9,
                                         nesterov=True, weight_decay=1e-4),
    "sgd-plain": lambda model: torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9,
                                               dampening=0.1),
    "adam": lambda model: torch.optim.Adam(model.parameters(), lr=1e-3, weight_decay=1e-4),
    "adamw": lambda model: torch.optim.AdamW(model.parameters(), lr=1e-3, amsgrad=True),
    "adam-maximize": lambda model: torch.optim.Adam(model.parameters(), lr=1e-4,
                                                    maximize=True),
    # PyTorch's foreach implementations (its default on CUDA), asked for explicitly: on CPU
    # the foreach ops take their per-tensor fallback, so this checks the mirrored sequence
    # of operations and scalars; tests/test_gpu.py checks the multi-tensor kernels.
    "sgd-foreach": lambda model: torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9,
                                                 nesterov=True, weight_decay=1e-4,
                                                 maximize=True, foreach=True),
    "adam-foreach": lambda model: torch.optim.Adam(model.parameters(), lr=1e-3,
                                                   weight_decay=1e-4, maximize=True,
                                                   foreach=True),
    "adamw-foreach": lambda model: torch.optim.AdamW(model.parameters(), lr=1e-3,
                                                     weight_decay=0.05, amsgrad=True,
                                                     foreach=True),
    # Channels-last convolution weights (Module.to converts in place, before the optimizer
    # sees the parameters): scratch views must take their strides.
    "adam-foreach-channels-last": lambda model: torch.optim.Adam(
        model.to(memory_format=torch.channels_last).parameters(), lr=1e-3,
        weight_decay=1e-4, foreach=True),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", required=True, help="a name in pyalloc.bench.models.TASKS")
    parser.add_argument("--batch", type=int, required=True)
    parser.add_argument("--optimizer", choices=sorted(OPTIMIZERS), required=True)
    parser.add_argument("--inplace-update", choices=["true", "false"], required=True,
                        help="the install option")
    args = parser.parse_args()
    pyalloc.install(device="cpu", budget="2GiB", inplace_update=args.inplace_update == "true")
    from pyalloc import inplace
    from pyalloc.bench.models import TASKS

    task = TASKS[args.task]
    torch.manual_seed(0)
    torch.use_deterministic_algorithms(True)
    model = task.build()
    opt = OPTIMIZERS[args.optimizer](model)
    x, y = task.batch(args.batch, torch.Generator().manual_seed(1))
    engine = pyalloc._engine(None)
    largest, addresses = [], []
    for _ in range(6):
        opt.zero_grad(set_to_none=True)
        loss = task.loss(model, x, y)
        loss.backward()
        engine.trace_start()
        opt.step()
        events = engine.trace_stop()["events"]
        largest.append(max([e[3] for e in events if e[1] == "alloc"], default=0))
        addresses.append([p.data_ptr() for p in model.parameters()]
                         + [p.grad.data_ptr() for p in model.parameters()]
                         + [t.data_ptr() for s in opt.state.values() for t in s.values()
                            if isinstance(t, torch.Tensor) and t.dim() > 0])
        print("loss", loss.item().hex())
    print_state_digest(model, opt)
    print("largest allocation in step", largest)
    print("same addresses", all(a == addresses[1] for a in addresses[1:]))
    segments = pyalloc.snapshot()["segments"]
    persistent = [(s["address"], s["address"] + s["total_size"]) for s in segments
                  if s["segment_type"] == "persistent"]
    print("in persistent",
          all(any(lo <= a < hi for lo, hi in persistent) for a in addresses[-1]))
    owned = {t.data_ptr(): t.untyped_storage().nbytes() for t in
             list(model.parameters()) + [p.grad for p in model.parameters()]
             + [t for s in opt.state.values() for t in s.values() if isinstance(t, torch.Tensor)]
             + list(inplace._scratch.values())}
    print("persistent segments hold no activation",
          sum(s["allocated_size"] for s in segments if s["segment_type"] == "persistent")
          == sum(max(512, -(-n // 512) * 512) for n in owned.values()))
    pyalloc.check_invariants()


if __name__ == "__main__":
    main()
