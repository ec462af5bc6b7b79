"""Side-by-side benchmark: msd against per-rank PyTorch DataLoaders on many sources.

    python -m benchmarks.dataloader [--quick] [--out benchmarks/results]
    python -m benchmarks.dataloader --point 256,8,2,16384     # one point: S,R,W,seq_len

Both systems feed the same simulated data-parallel trainer (``trainer.py``: R rank processes
that sleep for their batch's cost ``a·Σlen² + b·Σlen``, then meet at a gloo barrier) from the
same S synthetic Parquet sources (``data.py``: long-tail lengths, equal weights, the ``bytes``
transform) with the same rows of ``seq_len`` tokens per rank:

* baseline (``baseline.py``) — each rank runs ``DataLoader(num_workers=W)`` over a dataset whose
  every worker opens every source, keeps a decoded row group of each, mixes them by weight and
  packs its own micro-batch: no balancing across ranks;
* msd (``msd_run.py``) — the same data as a recipe through ``msd launch``: one Planner, loader
  processes serving ``--sources-per-process`` sources each, one Constructor.

Per point (S sources, R ranks, W workers, seq_len, rows per rank, row-group size) it measures
steps/s and tokens/s after warm-up, the trainers' data-wait per step (p50/p99), the data plane's
peak PSS (workers or roles, plus each rank's growth over its idle size), the data plane's CPU
seconds per 1M tokens, and how uneven each step's rank costs are (``metrics.py``). It writes
``dataloader.json``, ``dataloader.md`` and PNG plots to ``--out`` (``--quick``:
``dataloader-quick.*``), and fits a linear memory model per system (``memfit.py``).
"""
