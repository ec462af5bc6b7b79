"""The recipe: schema, loader and fingerprint (import-light: no torch)."""

from msd.recipe.load import load_recipe
from msd.recipe.schema import Recipe, stream_fingerprint

__all__ = ["Recipe", "load_recipe", "stream_fingerprint"]
