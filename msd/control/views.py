"""The structs ``msd status`` shows, under their former import path; they are declared in
``msd.wire.views`` because the protocol's ``Status`` message carries them."""

from msd.wire.views import (
    ConstructorView,
    JobView,
    LoaderView,
    PlannerView,
    RankView,
    SourceView,
    StatusView,
)

__all__ = [
    "ConstructorView",
    "JobView",
    "LoaderView",
    "PlannerView",
    "RankView",
    "SourceView",
    "StatusView",
]
