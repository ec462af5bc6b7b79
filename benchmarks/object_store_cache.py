"""Object-store cache benchmark: the quickstart's sources read from S3 for two epochs, without
and with the local cache (the recipe's ``cache``).

    python -m benchmarks.object_store_cache [--data demo-data] [--step-ms 0] [--warmup 10]
                                            [--endpoint URL] [--out benchmarks/results]

The demo data (``msd synth demo-data``, made if missing) is uploaded to an S3-compatible store as
in ``benchmarks.object_store`` (a moto server started here, or ``--endpoint``). An epoch is one
job of ``recipes/quickstart.yaml`` reading every source once (``repeat: false``) from
``s3://BUCKET/demo-data/...``; the second epoch is the same job again, right after (new
processes, the same samples). Without the cache both epochs fetch everything; with it (a fresh
folder of ``--max-bytes``) the first fetches and the second reads local disk.

Measured per epoch: the bytes the store sent over the data's size (moto: counted by a TCP proxy
in front of it, through which every role reaches it: HTTP headers and listings included; an
external store: not measured, only the loaders' cache counts), its GET requests, the loaders'
cache figures (``JOB/metrics.jsonl``), delivered tokens/s once warm, and the job's wall time.
Also measured, in this process: the CPU one reader spends per GiB of every Parquet row group of
the data read from local disk, from S3 directly, and through the cache on a hit (a
`pyarrow.PythonFile` over local block files).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import socket
import tempfile
import threading
import time
import urllib.parse
from pathlib import Path
from typing import Any

import msgspec
import pyarrow.parquet as pq

from benchmarks.object_store import Store, located, log
from benchmarks.quickstart import _rank_records, _steady_tokens_per_s, ensure_demo_data, machine
from msd.launch.local import LocalJob
from msd.recipe.load import load_recipe, with_job_cache
from msd.recipe.schema import Cache, Recipe
from msd.sources import storage
from msd.sources.cache import CacheConfig

ROOT = Path(__file__).resolve().parent.parent


def one_epoch(recipe: Recipe, step_ms: float, cache: Cache | None) -> Recipe:
    """``recipe`` reading every source once, at ``step_ms`` a step, through ``cache``."""
    sources = tuple(msgspec.structs.replace(s, repeat=False) for s in recipe.sources)
    trainer = recipe.trainer
    assert trainer is not None
    demo = msgspec.structs.replace(trainer.demo, step_ms=step_ms)
    trainer = msgspec.structs.replace(trainer, command="demo", demo=demo)
    epoch = msgspec.structs.replace(
        recipe, sources=sources, steps=None, trainer=trainer, cache=cache
    )
    return with_job_cache(epoch)


class CountingProxy(threading.Thread):
    """A TCP proxy on loopback in front of ``target`` (host, port), counting the bytes the
    target sends back."""

    def __init__(self, target: tuple[str, int]) -> None:
        super().__init__(daemon=True)
        self.target = target
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.endpoint = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        self.sent = 0
        self._lock = threading.Lock()

    def run(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return  # closed
            upstream = socket.create_connection(self.target)
            threading.Thread(target=self._pump, args=(client, upstream, False), daemon=True).start()
            threading.Thread(target=self._pump, args=(upstream, client, True), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, counted: bool) -> None:
        try:
            while data := src.recv(1 << 16):
                dst.sendall(data)
                if counted:
                    with self._lock:
                        self.sent += len(data)
        except OSError:
            pass
        finally:
            for sock in (src, dst):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)

    def stop(self) -> None:
        self.listener.close()


def served_bytes(proxy: CountingProxy | None) -> int:
    """Bytes the store has sent so far (0 where it is not proxied)."""
    return 0 if proxy is None else proxy.sent


def last_cache_figures(job_root: Path) -> dict[str, int]:
    lines = (job_root / "metrics.jsonl").read_text().splitlines()
    figures: dict[str, int] = json.loads(lines[-1]).get("cache", {})
    return figures


def run_epoch(
    recipe: Recipe, run_root: Path, warmup: int, store: Store, proxy: CountingProxy | None
) -> dict[str, Any]:
    job = LocalJob(recipe, "# benchmark\n", run_root)
    sent, log_at = served_bytes(proxy), store.log_offset()
    started = time.perf_counter()
    job.start()
    outcome = job.watch(lambda status: None)
    wall = time.perf_counter() - started
    if not outcome.ok or outcome.status is None:
        raise SystemExit(f"msd run failed: {outcome.message}")
    records = _rank_records(outcome.job.root)
    return {
        "job": str(outcome.job.root),
        "steps": outcome.status.consumed,
        "tokens": outcome.status.tokens_consumed,
        "tokens_per_s": _steady_tokens_per_s(records, warmup),
        "wall_s": wall,
        "store_sent_bytes": served_bytes(proxy) - sent,
        "store_requests": store.requests_since(log_at),
        "cache": last_cache_figures(outcome.job.root),
    }


def reader_cpu(
    files: list[str], urls: list[str], cache: CacheConfig, repeats: int
) -> dict[str, float]:
    """CPU seconds per GiB of file to read every row group of ``files``: from local disk, from
    S3 directly, and through ``cache`` once it holds them (the least of ``repeats`` runs)."""
    size = sum(os.path.getsize(f) for f in files)
    ways = {
        "local": (files, storage.Store()),
        "s3_direct": (urls, storage.Store()),
        "cache_hit": (urls, storage.Store(cache=cache)),
    }
    _read_all(urls, ways["cache_hit"][1])  # fills the cache
    best: dict[str, float] = {}
    for _ in range(repeats):
        for name, (paths, where) in ways.items():
            cpu, wall = time.process_time(), time.perf_counter()
            _read_all(paths, where)
            cpu_s, wall_s = time.process_time() - cpu, time.perf_counter() - wall
            best[name] = min(best.get(name, float("inf")), cpu_s)
            best[f"{name}_wall"] = min(best.get(f"{name}_wall", float("inf")), wall_s)
    gib = size / 2**30
    return {
        "file_bytes": size,
        **{f"{k}_cpu_s_per_gib": v / gib for k, v in best.items() if not k.endswith("_wall")},
        **{f"{k}_s_per_gib": v / gib for k, v in best.items() if k.endswith("_wall")},
    }


def _read_all(paths: list[str], where: storage.Store) -> None:
    for path in paths:
        source = path if not storage.is_remote(path) else storage.open_input(path, where)
        with pq.ParquetFile(source, pre_buffer=False, buffer_size=1 << 20) as pf:
            for i in range(pf.num_row_groups):
                pf.read_row_group(i, columns=["text"], use_threads=False)


def write_md(results: dict[str, Any], path: Path) -> None:
    size = results["data_bytes"]
    lines = [
        "# Object store: two epochs from S3, without and with the local cache",
        "",
        f"`python -m benchmarks.object_store_cache` — {results['machine']['cpus']} CPUs, "
        f"`recipes/quickstart.yaml`, every source read once per epoch (a job each), "
        f"step_ms {results['step_ms']:g}, warm-up {results['warmup']} steps; data "
        f"{size / 2**20:.1f} MiB of Parquet; S3: {results['store']}.",
        "",
        "| cache | epoch | store sent / data | GETs | cache hits / misses | tokens/s | wall s |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for mode in ("no cache", "cache"):
        for i, run in enumerate(results["modes"][mode], start=1):
            c = run["cache"]
            lines.append(
                f"| {mode} | {i} | {run['store_sent_bytes'] / size:.3f} | "
                f"{run['store_requests'].get('GET', 0)} | {c.get('hits', 0)} / "
                f"{c.get('misses', 0)} | {run['tokens_per_s'] / 1e6:.2f} M | {run['wall_s']:.1f} |"
            )
    lines += ["", "Epoch 2 over epoch 1, tokens/s:", ""]
    for mode in ("no cache", "cache"):
        first, second = results["modes"][mode]
        lines.append(f"- {mode}: {second['tokens_per_s'] / first['tokens_per_s']:.2f}")
    cpu = results["reader_cpu"]
    lines += [
        "",
        "One reader, every row group's `text` column of the data (least of "
        f"{results['cpu_repeats']} runs), CPU s per GiB of file: local disk "
        f"{cpu['local_cpu_s_per_gib']:.2f}, S3 direct {cpu['s3_direct_cpu_s_per_gib']:.2f}, "
        f"cache hit {cpu['cache_hit_cpu_s_per_gib']:.2f} (wall s per GiB: "
        f"{cpu['local_wall_s_per_gib']:.2f}, {cpu['s3_direct_wall_s_per_gib']:.2f}, "
        f"{cpu['cache_hit_wall_s_per_gib']:.2f}).",
        "",
        "The store's bytes are counted by a TCP proxy in front of moto: the objects' bytes "
        "plus HTTP headers, listings and HEADs, so a run that fetched nothing still shows a "
        "little. moto serves from memory on the same cores as the data plane: a real store's "
        "latency and bandwidth, which a cache hit avoids, are not modelled here. The S3-direct "
        "reader's CPU is this process's (its S3 client), not moto's.",
        "",
    ]
    path.write_text("\n".join(lines))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--recipe", type=Path, default=ROOT / "recipes" / "quickstart.yaml")
    parser.add_argument("--data", type=Path, default=Path("demo-data"))
    parser.add_argument("--step-ms", type=float, default=0.0)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--max-bytes", type=int, default=1 << 30)
    parser.add_argument("--cpu-repeats", type=int, default=3)
    parser.add_argument("--endpoint", default=None, help="an S3-compatible store (default: moto)")
    parser.add_argument("--bucket", default="msd-bench-object-store-cache")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    args = parser.parse_args()
    ensure_demo_data(args.data)
    data = args.data.resolve()
    files = sorted(str(p) for p in data.rglob("*.parquet"))
    run_root = args.out / "runs" / "object_store_cache"
    run_root.mkdir(parents=True, exist_ok=True)
    store = Store(args.endpoint, args.bucket, run_root / "moto")
    proxy = None
    if store.server is not None:  # every role reaches moto through the proxy: it counts
        address = urllib.parse.urlsplit(store.endpoint)
        proxy = CountingProxy((str(address.hostname), int(address.port or 80)))
        proxy.start()
        os.environ["AWS_ENDPOINT_URL"] = proxy.endpoint
    cache_dir = Path(tempfile.mkdtemp(prefix="msd-cache-bench-"))
    try:
        log(f"uploading {data} to {store.kind}")
        url = store.upload(data)
        base = located(load_recipe(args.recipe), url)
        modes: dict[str, list[dict[str, Any]]] = {}
        for mode, cache in (
            ("no cache", None),
            ("cache", Cache(dir=str(cache_dir / "jobs"), max_bytes=args.max_bytes)),
        ):
            recipe = one_epoch(base, args.step_ms, cache)
            modes[mode] = []
            for epoch in (1, 2):
                result = run_epoch(recipe, run_root, args.warmup, store, proxy)
                log(
                    f"{mode}, epoch {epoch}: {result['tokens_per_s'] / 1e6:.2f} M tokens/s, "
                    f"store sent {result['store_sent_bytes'] / 2**20:.1f} MiB, "
                    f"{result['store_requests']}, cache {result['cache']}"
                )
                modes[mode].append(result)
        urls = [f"{url}/{Path(f).relative_to(data).as_posix()}" for f in files]
        config = CacheConfig(str(cache_dir / "reader"), args.max_bytes)
        cpu = reader_cpu(files, urls, config, args.cpu_repeats)
        log(f"reader CPU: {cpu}")
    finally:
        if proxy is not None:
            proxy.stop()
        store.stop()
        shutil.rmtree(cache_dir, ignore_errors=True)
    results: dict[str, Any] = {
        "machine": machine(),
        "store": store.kind,
        "recipe": str(args.recipe),
        "data_bytes": sum(os.path.getsize(f) for f in files),
        "step_ms": args.step_ms,
        "warmup": args.warmup,
        "max_bytes": args.max_bytes,
        "cpu_repeats": args.cpu_repeats,
        "load_average_end": os.getloadavg()[0],
        "modes": modes,
        "reader_cpu": cpu,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "object_store_cache.json").write_text(json.dumps(results, indent=2) + "\n")
    write_md(results, args.out / "object_store_cache.md")
    print((args.out / "object_store_cache.md").read_text())


if __name__ == "__main__":
    main()
