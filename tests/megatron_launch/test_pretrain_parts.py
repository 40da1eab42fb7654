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


def test_pretrain_convention_by_signature() -> None:
    import pytest

    from zeppelin_megatron.megatron.arguments import ZeppelinArgsError
    from zeppelin_megatron.megatron.pretrain import pretrain_convention

    # signatures as in Megatron-LM's megatron/training/training.py
    def v016(train_valid_test_dataset_provider, model_provider, model_type, forward_step_func,
             process_non_loss_data_func=None, extra_args_provider=None, args_defaults=None, get_embedding_ranks=None,
             store=None): ...

    def v018(cfg_container, train_valid_test_dataset_provider, model_provider, model_type, forward_step_func,
             process_non_loss_data_func=None, get_embedding_ranks=None, store=None): ...

    def v019(cfg_container, train_valid_test_dataset_provider, model_type, forward_step_func, model_provider=None,
             process_non_loss_data_func=None, get_embedding_ranks=None, store=None): ...

    def unknown(config, datasets): ...

    assert [pretrain_convention(f) for f in (v016, v018, v019)] == ["args", "container", "model-config"]
    with pytest.raises(ZeppelinArgsError, match="unknown Megatron-LM pretrain"):
        pretrain_convention(unknown)


def test_use_zeppelin_model_sets_spec_and_hook_once() -> None:
    import pytest

    from zeppelin_megatron.megatron.arguments import ZeppelinArgsError
    from zeppelin_megatron.megatron.pretrain import prepare_model_chunks, use_zeppelin_model, zeppelin_layer_spec

    class GPTModelConfig:  # the two fields Megatron's GPTModelBuilder reads (core_v0.19 on)
        def __init__(self) -> None:
            self.transformer_layer_spec = None
            self.pre_wrap_hooks = [print]

    cfg = use_zeppelin_model(use_zeppelin_model(GPTModelConfig()))
    assert cfg.transformer_layer_spec is zeppelin_layer_spec
    assert cfg.pre_wrap_hooks == [print, prepare_model_chunks]
    with pytest.raises(ZeppelinArgsError, match="transformer_layer_spec"):
        use_zeppelin_model(object())


def test_iterators_plan_in_a_worker_process_when_they_prefetch() -> None:
    from zeppelin_megatron.megatron.arguments import ZeppelinConfig
    from zeppelin_megatron.megatron.data.plan_worker import PlanWorker
    from zeppelin_megatron.megatron.data.build import iterator_planner
    from zeppelin_megatron.planner.setup import build_planning

    planning = build_planning("1x4", tokens_per_gpu=4096)
    worker = iterator_planner(ZeppelinConfig(cluster="1x4"), planning)  # the default: prefetch 2, worker on
    try:
        assert isinstance(worker, PlanWorker)
        assert worker([3000, 20, 900]).to_json() == planning([3000, 20, 900]).to_json()
    finally:
        worker.close()  # type: ignore[attr-defined]
    assert iterator_planner(ZeppelinConfig(cluster="1x4", plan_worker=False), planning) is planning
    assert iterator_planner(ZeppelinConfig(cluster="1x4", prefetch=0), planning) is planning  # inline: nothing to hide
