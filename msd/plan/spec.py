"""The recipe reduced to what the planning math reads: the stream's spec and the topology."""

from __future__ import annotations

from msd.plan.cost import CostModel
from msd.plan.schedule import MixChange, schedule_of
from msd.plan.step import StreamSpec
from msd.plan.topology import Topology
from msd.recipe.schema import Recipe, pad_multiple


def stream_spec(
    recipe: Recipe, num_rows: tuple[int, ...], changes: tuple[MixChange, ...] = ()
) -> StreamSpec:
    return StreamSpec(
        seed=recipe.seed,
        schedule=schedule_of(recipe, changes),
        num_rows=num_rows,
        repeat=tuple(s.repeat for s in recipe.sources),
        dp=recipe.distribute.dp,
        micro_batches=recipe.micro_batches,
        micro_batch_size=recipe.micro_batch_size,
        seq_len=recipe.seq_len,
        steps=recipe.steps,
        pad_multiple=pad_multiple(recipe.distribute),
        long_samples=recipe.balance.long_samples,
        method=recipe.balance.method,
        cost=CostModel(recipe.cost.attn, recipe.cost.lin, recipe.cost.function),
        max_patches=recipe.balance.max_patches if recipe.has_images else None,
    )


def topology_of(recipe: Recipe) -> Topology:
    d = recipe.distribute
    return Topology(
        d.dp,
        d.pp,
        d.cp,
        d.tp,
        d.order,
        vision=recipe.has_images,
        videos=recipe.has_videos,
        masks=recipe.has_masks,
    )
