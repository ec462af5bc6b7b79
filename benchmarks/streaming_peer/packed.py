"""A ``StreamingDataset`` whose every DataLoader worker packs its rank's micro-batches.

As the baseline's workers do (``benchmarks/dataloader/baseline.py``): the worker takes the
samples Streaming gives it (its share of the epoch, shuffled, mixed by the streams'
proportions), tokenizes each the way msd's ``bytes`` transform does (the UTF-8 bytes are the
ids; MDS ``str`` columns come back decoded, so they are encoded again), splits samples longer
than ``seq_len``, packs ``rows`` rows first fit (``packing.py``) and collates with
``msd.batch.pack.pack_rows``: the tensors are the ones msd delivers. Nothing balances cost across
ranks: Streaming has no notion of it.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import torch

from benchmarks.dataloader.packing import Item, MicroBatchPacker, split_long
from benchmarks.streaming_peer.lib import StreamingDataset
from msd.batch.pack import pack_rows

TEXT_COLUMN = "text"
_ID_KEY = "__sample_id"


class PackedStreamingDataset(StreamingDataset):  # type: ignore[misc]
    """Streaming's dataset, yielding packed micro-batches instead of samples."""

    def __init__(self, *, seq_len: int, rows: int, patience: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.seq_len = seq_len
        self.rows = rows
        self.patience = patience

    def get_item(self, sample_id: int, retry: int = 7) -> Any:
        """Streaming's sample, with its global index (the id msd's batches carry too)."""
        sample = super().get_item(sample_id, retry)
        sample[_ID_KEY] = sample_id
        return sample

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        packer = MicroBatchPacker(self.rows, self.seq_len, self.patience)
        items = self.items(super().__iter__())
        while True:
            try:
                rows = packer.next_rows(items)
            except StopIteration:  # the epoch ended (never within a run: see config.py)
                return
            arrays = pack_rows(rows, self.seq_len)
            yield {name: torch.from_numpy(array) for name, array in arrays.items()}

    def items(self, samples: Iterator[dict[str, Any]]) -> Iterator[Item]:
        for sample in samples:
            sample_id = int(sample[_ID_KEY])
            shard, _ = self.spanner[sample_id]
            source = int(self.stream_per_shard[shard])
            text: str = sample[TEXT_COLUMN]
            tokens = np.frombuffer(text.encode("utf-8"), dtype=np.uint8).astype(np.int32)
            yield from split_long(source, sample_id, tokens, self.seq_len)
