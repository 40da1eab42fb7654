"""Megatron-LM integration: the only package of zeppelin_megatron that imports megatron.

Model side: :mod:`.attention` (``ZeppelinCoreAttention``, a ``core_attention`` for
Megatron's ModuleSpec), :mod:`.spec` (GPT layer specs with it), :mod:`.step`
(binding each micro-step's plan and positions to a built model), :mod:`.groups`
(the Zeppelin process group from Megatron's parallel state), :mod:`.loss`.
Training side: :mod:`.arguments` (Zeppelin's flags), :mod:`.run_shape` (Megatron's, the run's shape),
:mod:`.batch_schedule`, :mod:`.planning`, :mod:`.pretrain`, :mod:`.metrics`,
:mod:`.data`. Submodules are imported on demand (nothing heavy here).
"""
