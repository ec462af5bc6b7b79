"""Entry point of every role process: ``python -m msd.roles ROLE --job DIR ...``.

The local launcher and the SLURM launcher start roles through this one door, so a role behaves
the same wherever it is placed.
"""

from __future__ import annotations

import argparse
import sys

from msd import logs
from msd.jobdir import JobDir
from msd.roles.common import (
    FAILURE_PREFIX,
    StopRequested,
    die_with_parent,
    run_role,
    stop_on_signals,
)
from msd.roles.footprint import arrow_on_malloc, fix_mmap_threshold, keep_pandas_out


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m msd.roles")
    parser.add_argument("role", choices=["planner", "loader", "constructor"])
    parser.add_argument("--job", required=True)
    parser.add_argument("--name", default="", help="the loader process (msd.plan.partition)")
    parser.add_argument("--node", default="local")
    parser.add_argument("--ranks", default="")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = _parse(sys.argv[1:] if argv is None else argv)
    logs.setup(args.role, _name(args))
    fix_mmap_threshold()
    if args.role == "loader":
        arrow_on_malloc()
    keep_pandas_out()
    die_with_parent()
    stop_on_signals()
    job = JobDir(args.job)
    if args.role == "planner":
        from msd.roles import planner

        return run_role("planner", "planner", lambda: None, lambda: planner.main(job))
    if args.role == "loader":
        from msd.roles import loader

        name = args.name
        return run_role(
            "loader",
            name,
            lambda: _planner_socket(job, FAILURE_PREFIX.decode() + f"loader/{name}"),
            lambda: loader.main(job, name),
        )
    from msd.roles import constructor

    ranks = tuple(int(r) for r in args.ranks.split(",") if r)
    return run_role(
        "constructor",
        args.node,
        lambda: _planner_socket(job, FAILURE_PREFIX.decode() + f"constructor/{args.node}"),
        lambda: constructor.main(job, args.node, ranks),
    )


def _name(args: argparse.Namespace) -> str:
    """The role process's name in its log lines: a loader's name, a Constructor's node."""
    names: dict[str, str] = {"planner": "planner", "loader": args.name, "constructor": args.node}
    return names[args.role]


def _planner_socket(job: JobDir, identity: str):  # type: ignore[no-untyped-def]
    from msd.roles.common import connect_planner

    try:
        return connect_planner(job, identity)
    except (StopRequested, Exception):
        return None


if __name__ == "__main__":
    sys.exit(main())
