"""Convergence parity: a model trained on msd's batches learns exactly as it does from a plain
per-rank ``torch.utils.data.DataLoader`` over the same samples, packed the same way.

The same tiny Llama (examples/hf_llama.py: model, seed, optimizer and step) is trained for 200
steps by two data-parallel ranks (gloo, CPU):

* with msd: ``msd launch``, the example logging each rank's samples per step (``--log-samples``);
* with the reference written here: each rank's own DataLoader over a map-style dataset that reads
  the Parquet files itself and tokenizes with the ``bytes`` transform (UTF-8 bytes), a
  ``batch_sampler`` that yields each step's samples, and its own packing in ``collate_fn``.

A rank gets one row of ``seq_len`` tokens a step, so a rank's samples in msd's order, packed back
to back, are its whole batch: the reference rebuilds msd's tensors without knowing how msd chose
rows. The two recipes differ only in ``balance.method``, which decides which rank trains each of
a step's samples, never which samples form the step.

* Balancing off (``none``): the reference's ranks get msd's ranks' samples. Their tensors are
  msd's bit for bit, and so is the loss curve.
* Balancing on (``greedy``): the reference deals each step's samples to the ranks as a
  ``DistributedSampler`` does (sorted by source and id, every other one), unbalanced. Only where
  a sample is trained differs, so the curves differ only by float32 rounding (``TOLERANCE``).
"""

from __future__ import annotations

import functools
import glob
import importlib.util
import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
import torch.distributed as dist
import yaml
from torch.utils.data import DataLoader, Dataset

from msd.launch.ports import free_port
from tests.conftest import assert_launch_ok, start_launch

# The launches run in the module's fixtures, in its first test's time: a minute or two, more
# on a busy machine.
pytestmark = pytest.mark.timeout(600)

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "hf_llama.py"
STEPS = 200
RANKS = 2
SEQ_LEN = 256
IGNORE_INDEX = -100
METHODS = ("none", "greedy")

# How far msd's balanced run and the unbalanced reference may differ, per step. Both train the
# same samples each step; only which rank holds a sample, and where in its row, differs. So
# float32 sums (a rank's cross-entropy, each weight's gradient over its tokens, attention over a
# row) add the same terms in another order, and the loss differs by rounding, ~1e-7 relative:
# 2.5e-7 measured at step 0, where the weights are still the same, and at most 5.6e-7 over the
# 200 steps, on a loss falling from 5.6 to 1.2. At the example's learning rate (1e-3) training
# does not amplify it; at 3e-3 it would, chaotically (1.3e-3 measured by step 200), and this
# bound would not hold. It has ~20x margin, and lies four orders of magnitude below any change
# in what is trained: the loss itself moves by ~9e-2 from one step to the next.
TOLERANCE = 1e-5

Key = tuple[int, int, int]  # (source, sample id, offset): one piece of a sample
Runs = dict[str, list[list[dict[str, Any]]]]  # by method: records[rank][step]

# The data: words drawn with Zipf's law, so the model has spelling to learn and its loss keeps
# falling over the 200 steps; lengths log-normal (median, sigma, rows), some over seq_len.
_WORD_LIST = (
    "the of and to in is you that it he was for on are as with his they at be this have from "
    "or one had by word but not what all were we when your can said there use an each which "
    "she do how their if will up other about out many then them these so some her would make "
    "like him into time has look two more write go see number no way could people my than "
    "first water been call who oil its now find long down day did get come made may part"
)
WORDS = _WORD_LIST.split()
SOURCES = {"notes": (30, 0.8, 600), "essays": (120, 0.7, 200)}
LONGEST = RANKS * SEQ_LEN  # a step's tokens: no sample loses any to long_samples: split


def word_text(rng: np.random.Generator, length: int) -> str:
    """``length`` bytes of space-separated words."""
    ranks = np.arange(1, len(WORDS) + 1)
    words = rng.choice(WORDS, size=length // 2 + 1, p=(1 / ranks) / (1 / ranks).sum())
    return " ".join(words)[:length]


def write_sources(root: Path) -> dict[str, str]:
    """Each source's files (two, row groups of 32 rows); its glob by name."""
    rng = np.random.default_rng(7)
    globs = {}
    for name, (median, sigma, rows) in SOURCES.items():
        lengths = np.clip(rng.lognormal(np.log(median), sigma, rows), 16, LONGEST).astype(int)
        texts = [word_text(rng, int(n)) for n in lengths]
        (root / name).mkdir(parents=True)
        for part, half in enumerate((texts[: rows // 2], texts[rows // 2 :])):
            table = pa.table({"text": pa.array(half, pa.string())})
            pq.write_table(table, root / name / f"part-{part}.parquet", row_group_size=32)
        globs[name] = str(root / name / "*.parquet")
    return globs


def load_example() -> ModuleType:
    """examples/hf_llama.py as a module (examples/ is not a package)."""
    spec = importlib.util.spec_from_file_location("hf_llama", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# -- the reference: per-rank DataLoaders -------------------------------------------------------
class SourcePieces(Dataset[np.ndarray]):
    """``(source, sample id, offset)`` → the piece's token ids: the sample is row ``sample id``
    of the source's files in path order, its ids its UTF-8 bytes, a piece at most ``seq_len``."""

    def __init__(self, files: list[list[str]], seq_len: int) -> None:
        self.texts = [
            [text for path in paths for text in pq.read_table(path).column("text").to_pylist()]
            for paths in files
        ]
        self.seq_len = seq_len

    def __getitem__(self, key: Key) -> np.ndarray:
        source, sample_id, offset = key
        ids = np.frombuffer(self.texts[source][sample_id].encode("utf-8"), dtype=np.uint8)
        return ids[offset : offset + self.seq_len].astype(np.int64)


def pack(pieces: list[np.ndarray], seq_len: int) -> dict[str, torch.Tensor]:
    """Pieces back to back in rows of ``seq_len`` (a new row when the next does not fit), each
    its own sequence: labels shifted within it, positions from 0, a padding run to the row's
    end (its own sequence too)."""
    rows: list[list[np.ndarray]] = [[]]
    room = seq_len
    for piece in pieces:
        if len(piece) > room:
            rows.append([])
            room = seq_len
        rows[-1].append(piece)
        room -= len(piece)
    shape = (len(rows), seq_len)
    input_ids, labels = np.zeros(shape, np.int64), np.full(shape, IGNORE_INDEX, np.int64)
    position_ids, bounds = np.zeros(shape, np.int64), [0]
    for r, row in enumerate(rows):
        at = 0
        for piece in row:
            n = len(piece)
            input_ids[r, at : at + n] = piece
            labels[r, at : at + n - 1] = piece[1:]
            position_ids[r, at : at + n] = np.arange(n)
            at += n
            bounds.append(r * seq_len + at)
        if at < seq_len:
            position_ids[r, at:] = np.arange(seq_len - at)
            bounds.append((r + 1) * seq_len)
    arrays = {"input_ids": input_ids, "labels": labels, "position_ids": position_ids}
    return {k: torch.from_numpy(v) for k, v in arrays.items()} | {
        "cu_seqlens": torch.tensor(bounds, dtype=torch.int32)
    }


def reference_rank() -> None:
    """One reference rank (``python -c``): ``argv``: the plan's JSON, the log to write."""
    plan, out = json.loads(Path(sys.argv[1]).read_text()), Path(sys.argv[2])
    rank = int(os.environ["RANK"])
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    hf = load_example()
    args = hf.parse_args([])
    model = hf.build_model(args, plan["seq_len"])
    optimizer = hf.make_optimizer(model, args)
    ddp = hf.data_parallel(model, torch.device("cpu"))
    batches = [[tuple(key) for key in step] for step in plan["batches"][rank]]
    loader = DataLoader(
        SourcePieces(plan["files"], plan["seq_len"]),
        batch_sampler=batches,
        collate_fn=functools.partial(pack, seq_len=plan["seq_len"]),
        num_workers=1,
    )
    with open(out, "w") as log:
        for step, batch in enumerate(loader):
            loss, tokens = hf.train_step(ddp, optimizer, batch, step, args)
            record = {"step": step, "loss": loss, "global_tokens": tokens}
            log.write(json.dumps(record | {"digest": hf.batch_digest(batch)}) + "\n")
    dist.destroy_process_group()


def run_reference(
    folder: Path, plan: dict[str, Any], module: str = "tests.integration.test_convergence"
) -> list[list[dict[str, Any]]]:
    """Both reference ranks (``module``'s ``reference_rank``) to the end; each rank's records."""
    folder.mkdir()
    (folder / "plan.json").write_text(json.dumps(plan))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "WORLD_SIZE": str(RANKS)}
    env |= {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}
    command = f"from {module} import reference_rank; reference_rank()"
    ranks = []
    for rank in range(RANKS):
        argv = [sys.executable, "-c", command, "plan.json", f"rank-{rank}.jsonl"]
        with open(folder / f"rank-{rank}.log", "w") as output:
            ranks.append(
                subprocess.Popen(
                    argv,
                    cwd=folder,
                    env=env | {"RANK": str(rank)},
                    stdout=output,
                    stderr=subprocess.STDOUT,
                )
            )
    try:
        wait_ranks(folder, ranks)
    finally:
        for proc in ranks:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return [
        [json.loads(line) for line in (folder / f"rank-{rank}.jsonl").read_text().splitlines()]
        for rank in range(RANKS)
    ]


def wait_ranks(folder: Path, ranks: list[subprocess.Popen[bytes]], timeout_s: float = 600) -> None:
    """Until every rank exited 0; fails on the first that does not (its peers would wait)."""
    deadline = time.monotonic() + timeout_s
    while not all(proc.poll() == 0 for proc in ranks):
        for rank, proc in enumerate(ranks):
            if proc.poll() not in (None, 0):
                log = (folder / f"rank-{rank}.log").read_text()[-3000:]
                raise AssertionError(f"reference rank {rank} exited {proc.returncode}:\n{log}")
        assert time.monotonic() < deadline, f"the reference ranks took over {timeout_s} s"
        time.sleep(0.1)


# -- the msd runs and what the reference gets of them ------------------------------------------
def parity_recipe(globs: dict[str, str], method: str) -> dict[str, Any]:
    return {
        "name": f"parity-{method}",
        "seed": 3,
        "steps": STEPS,
        "seq_len": SEQ_LEN,
        "global_batch_tokens": RANKS * SEQ_LEN,  # one row a rank
        "distribute": {"dp": RANKS},
        "balance": {"method": method},
        "sources": [
            {"name": name, "path": path, "text_column": "text", "weight": weight}
            for (name, path), weight in zip(globs.items(), (0.6, 0.4), strict=True)
        ],
        "loader": {"sources_per_process": len(globs)},  # one loader process
        "trainer": {"command": f"python {EXAMPLE} --log-samples"},
    }


def read_steps(job: Path) -> list[list[dict[str, Any]]]:
    """``steps[rank][step]``: what each rank of the msd run logged."""
    steps = []
    for rank in range(RANKS):
        lines = (job / "trainer" / f"hf-rank-{rank}.jsonl").read_text().splitlines()
        steps.append([json.loads(line) for line in lines])
        assert [r["step"] for r in steps[-1]] == list(range(STEPS))
    return steps


def keys(record: dict[str, Any]) -> list[Key]:
    """The pieces a rank got in a step, in msd's order."""
    columns = (record["source_ids"], record["sample_ids"], record["sample_offsets"])
    return [(s, i, o) for s, i, o in zip(*columns, strict=True)]


def dealt(steps: list[list[dict[str, Any]]]) -> list[list[list[Key]]]:
    """Each step's pieces sorted by (source, id, offset) and dealt to the ranks in turn, as a
    DistributedSampler deals indices: no balancing."""
    ranks: list[list[list[Key]]] = [[] for _ in range(RANKS)]
    for step in range(STEPS):
        pieces = sorted(key for rank in range(RANKS) for key in keys(steps[rank][step]))
        for rank in range(RANKS):
            ranks[rank].append(pieces[rank::RANKS])
    return ranks


@pytest.fixture(scope="module")
def sources(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    return write_sources(tmp_path_factory.mktemp("words"))


@pytest.fixture(scope="module")
def msd_runs(tmp_path_factory: pytest.TempPathFactory, sources: dict[str, str]) -> Runs:
    """Both msd runs (side by side): each method's ``steps[rank][step]``."""
    launchers = {}
    for method in METHODS:
        folder = tmp_path_factory.mktemp(f"msd-{method}")
        recipe = parity_recipe(sources, method)
        (folder / "r.yaml").write_text(yaml.safe_dump(recipe, sort_keys=False))
        launchers[method] = (folder, start_launch(folder, "r.yaml"))
    runs = {}
    try:
        for method, (folder, launcher) in launchers.items():
            out, err = launcher.communicate(timeout=600)
            assert_launch_ok(launcher, out, err)
            (job,) = (folder / "runs").iterdir()
            runs[method] = read_steps(job)
    finally:
        for _, launcher in launchers.values():
            if launcher.poll() is None:
                launcher.kill()
    return runs


@pytest.fixture(scope="module")
def references(
    tmp_path_factory: pytest.TempPathFactory,
    sources: dict[str, str],
    msd_runs: Runs,
) -> Runs:
    """The reference trained on msd's per-rank samples (``none``) and on each step's samples
    dealt without balancing (``greedy``), side by side: ``records[rank][step]`` of each."""
    plans = {
        "none": [[keys(r) for r in rank] for rank in msd_runs["none"]],
        "greedy": dealt(msd_runs["greedy"]),
    }
    root = tmp_path_factory.mktemp("reference")
    files = [sorted(glob.glob(path)) for path in sources.values()]  # msd reads them by path
    with ThreadPoolExecutor(max_workers=len(plans)) as pool:
        futures = {
            method: pool.submit(
                run_reference,
                root / method,
                {"files": files, "seq_len": SEQ_LEN, "batches": plan},
            )
            for method, plan in plans.items()
        }
        return {method: future.result() for method, future in futures.items()}


def losses(records: list[dict[str, Any]]) -> list[float]:
    return [r["loss"] for r in records]


def test_balancing_changes_which_rank_trains_a_sample_not_the_step(msd_runs: Runs) -> None:
    """The premise of the comparison: the same samples form each step under both methods, and
    balancing moves some between ranks in many steps (71 of the 200 here)."""
    moved = 0
    for step in range(STEPS):
        by_rank = {
            method: [sorted(keys(run[rank][step])) for rank in range(RANKS)]
            for method, run in msd_runs.items()
        }
        assert sorted(k for r in by_rank["none"] for k in r) == sorted(
            k for r in by_rank["greedy"] for k in r
        )
        moved += by_rank["none"] != by_rank["greedy"]
    assert moved >= STEPS // 4, moved
    for run in msd_runs.values():
        assert losses(run[0]) == losses(run[1])  # the global mean: the same on every rank
        assert losses(run[0])[-1] < 0.8 * losses(run[0])[0]  # it learns


def test_without_balancing_the_reference_gets_msd_batches_and_loss_curve_exactly(
    msd_runs: Runs, references: Runs
) -> None:
    for rank in range(RANKS):
        ours, theirs = msd_runs["none"][rank], references["none"][rank]
        assert [r["digest"] for r in theirs] == [r["digest"] for r in ours]
        assert losses(theirs) == losses(ours)
        assert [r["global_tokens"] for r in theirs] == [r["global_tokens"] for r in ours]


def test_with_balancing_the_loss_curve_matches_the_unbalanced_reference(
    msd_runs: Runs, references: Runs
) -> None:
    ours, theirs = msd_runs["greedy"], references["greedy"]
    # The reference's split differs from msd's in most steps (else this compares little).
    split = dealt(ours)
    differs = sum(
        any(sorted(split[r][s]) != sorted(keys(ours[r][s])) for r in range(RANKS))
        for s in range(STEPS)
    )
    assert differs >= STEPS * 3 // 4, differs
    assert [r["global_tokens"] for r in theirs[0]] == [r["global_tokens"] for r in ours[0]]
    difference = np.abs(np.array(losses(ours[0])) - np.array(losses(theirs[0])))
    assert difference.max() < TOLERANCE, (difference.max(), int(difference.argmax()))
