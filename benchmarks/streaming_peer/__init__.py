"""MosaicML Streaming as a second peer of msd, side by side, from the same S3 server.

    bash benchmarks/streaming_peer/setup_peer.sh          # once: .venv-peer with Streaming
    python -m benchmarks.streaming_peer [--sources 8 32] [--ranks 4] [--steps 400] [--out DIR]

Streaming is what many users would pick instead of msd, so it gets the seat the per-rank
DataLoader baseline has in ``benchmarks.dataloader``, with the same harness:

* the data: S synthetic Parquet sources of ``benchmarks/dataloader/data.py`` (4 MB each, 2 MB
  row groups, long-tail lengths, equal weights), and the same rows as MDS shards
  (``mds.py``: a ``str`` column, zstd:3 like the Parquet, shards of a row group's size), both
  uploaded to one moto S3 server (``tests/s3/server.py``, auth on; ``store.py``);
* Streaming (``rank.py``, ``packed.py``): per rank a ``StreamingDataset`` with one
  ``Stream(remote=s3://..., local=<cache>, proportion=w)`` per source, ``shuffle=True``, in a
  ``DataLoader`` of W workers that tokenize (``bytes``: UTF-8 bytes as ids) and pack the rank's
  rows as the dataloader baseline does; the endpoint from ``S3_ENDPOINT_URL``;
* msd: the dataloader benchmark's recipe with ``s3://`` paths, through ``msd launch``
  (``run.py``);
* the same simulated trainer (``benchmarks/dataloader/trainer.py``'s ``train``: sleep for the
  batch's cost, gloo barrier) and metrics (``metrics.py``, ``procmon.py``): steps/s after
  warm-up, data-wait p50/p99, peak data-plane PSS plus the ranks' growth, data-plane CPU per
  1M tokens (in the warm window and over the whole run), plus the S3 server's CPU, the GETs
  and bytes it served, and the local disk Streaming's cache took.

It writes ``streaming_peer.json`` and ``streaming_peer.md`` (``report.py``) to ``--out``.
Streaming runs in ``.venv-peer`` (``setup_peer.sh``: the project's ``.venv`` plus Streaming,
never another torch); ``lib.py`` says how it is imported.
"""
