"""Parts of pretrain.py that need no Megatron-LM checkout: argv preparation, loss, unwrapping."""

from __future__ import annotations

import torch

from zeppelin_megatron.megatron.pretrain import _unwrap, loss_func, prepare_argv


def test_prepare_argv_adds_required_flags_once() -> None:
    argv = prepare_argv(["x.py", "--zeppelin"])
    assert argv == ["x.py", "--zeppelin", "--calculate-per-token-loss", "--dataloader-type", "external"]
    assert prepare_argv(argv) == argv
    # a user's value is kept (and then rejected by the checks when it is not 'external')
    assert prepare_argv(["x.py", "--dataloader-type", "single"]).count("--dataloader-type") == 1
    assert prepare_argv(["x.py", "--dataloader-type=single"]).count("--dataloader-type") == 0


def test_loss_func_sums_masked_tokens() -> None:
    losses = torch.tensor([[1.0, 2.0, 3.0, 4.0]], requires_grad=True)
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]])  # last token is sequence-parallel padding
    loss, n, report = loss_func(mask, losses)
    assert float(loss.detach()) == 6.0 and int(n) == 3
    assert report["lm loss"].tolist() == [6.0, 3.0]
    loss.backward()
    assert losses.grad.tolist() == [[1.0, 1.0, 1.0, 0.0]]


def test_unwrap_megatron_wrappers() -> None:
    inner = torch.nn.Linear(2, 2)

    class Wrapper(torch.nn.Module):  # DDP and Float16Module keep the model as .module
        def __init__(self, module: torch.nn.Module) -> None:
            super().__init__()
            self.module = module

    assert _unwrap(Wrapper(Wrapper(inner))) is inner
    assert _unwrap(inner) is inner
