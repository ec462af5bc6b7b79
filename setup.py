"""Package discovery that pyproject.toml cannot express on its own: every ``msd*`` package
under ``msd/`` is found, and ``cli/`` and ``templates/`` (mapped in pyproject.toml's
``package-dir``) are added as ``msd.cli`` and ``msd.templates``."""

from setuptools import find_packages, setup

setup(packages=[*find_packages(include=["msd", "msd.*"]), "msd.cli", "msd.templates"])
