"""Zeppelin's data path for Megatron: documents, token-budget micro-steps, per-rank batches.

* :mod:`.documents`: what every source shares: whole documents as training sequences, truncated at
  ``seq_length`` inputs, a ``--split`` share (``Documents``);
* :mod:`.indexed`: the documents of a Megatron indexed dataset (``.bin``/``.idx``) (``document_lengths``,
  ``DocumentDataset``); :mod:`.mock`: Megatron's ``--mock-data`` documents (``MockDocuments``);
* :mod:`.blend`: several datasets blended by weight as Megatron's ``--data-path W1 P1 W2 P2``
  (``parse_blend``, ``open_documents``, ``BlendedDocuments``, ``blend_order``);
* :mod:`.sampler`: deterministic epochs cut into micro-steps of at most a token
  budget (``TokenBudgetSampler``);
* :mod:`.iterator`: plans each micro-step and hands a rank its linear-layout tokens,
  labels, loss mask and positions (``ZeppelinDataIterator``, ``ZeppelinBatch``),
  resumable from Megatron's consumed-samples counter.

Submodules are imported on demand: ``indexed`` imports megatron.core lazily,
``iterator`` imports torch.
"""
