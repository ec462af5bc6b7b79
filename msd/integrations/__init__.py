"""Adapters from msd's batches to what a training framework's loop expects.

Each lives in its own module and imports its framework only inside it, so ``import msd`` never
requires one: ``msd.integrations.megatron`` for Megatron-LM and megatron-core,
``msd.integrations.transformers`` (``MsdTrainer``) for Hugging Face's ``Trainer``.
"""
