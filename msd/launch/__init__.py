"""Starting and supervising jobs. The package is callable: ``msd.launch(recipe, ...)`` is
`msd.launch.api.launch` (imported on the first call, so ``import msd`` stays light); typed
code may import that function itself."""

from __future__ import annotations

import sys
import types
from typing import Any


class _CallablePackage(types.ModuleType):
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        from msd.launch.api import launch

        return launch(*args, **kwargs)


sys.modules[__name__].__class__ = _CallablePackage
