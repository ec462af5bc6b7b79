"""Adapters from msd's batches to what a training framework's loop expects.

Each lives in its own module and imports its framework only inside the functions that need it,
so ``import msd`` never requires one: ``msd.integrations.megatron`` for Megatron-LM and
megatron-core.
"""
"""Adapters that feed msd's batches to other training frameworks (imported only on demand)."""
