"""Digests a training program prints so that two runs can be compared bit for bit.

Imported by the programs beside it (a program run as ``python tests/programs/NAME.py``
finds this module on ``sys.path[0]``); not a program itself.
"""
from __future__ import annotations

import hashlib

import torch


def print_param_digest(model: torch.nn.Module) -> None:
    """Prints ``params <sha256>`` of every parameter of ``model``."""
    digest = hashlib.sha256()
    for param in model.parameters():
        digest.update(param.detach().cpu().numpy().tobytes())
    print("params", digest.hexdigest())


def print_state_digest(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
    """Prints ``params <sha256>`` of everything training changes: parameters, buffers
    (BatchNorm's running statistics) and the optimizer's state, on any device."""
    digest = hashlib.sha256()
    optimizer_state = [value for state in optimizer.state_dict()["state"].values()
                       for value in state.values() if isinstance(value, torch.Tensor)]
    for tensor in list(model.state_dict().values()) + optimizer_state:
        digest.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    print("params", digest.hexdigest())
