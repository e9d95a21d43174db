"""A stand-in for DVCLive where it is not installed (a bare GPU machine, which has no DVC):
runs keep their metrics.json, not their curves."""

from typing import Any


class Live:
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.step = 0

    def _init_dvc(self) -> None: ...
    def log_metric(self, *args: Any, **kwargs: Any) -> None: ...
    def make_summary(self) -> None: ...
    def end(self) -> None: ...
