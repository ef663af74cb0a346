"""The tracker interface training code calls (:class:`Tracker`), the tracker that discards everything
(:class:`NullTracker`), and :class:`Interrupted`, the signal a job's tracker records as KILLED."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping, Optional, Protocol


class Interrupted(BaseException):
    """Raised in the main thread by the SIGTERM/SIGINT handler of a job (see ``fedshift.cli``)."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


class Tracker(Protocol):
    def log_params(self, params: Mapping[str, Any]) -> None: ...
    def log_metrics(self, metrics: Mapping[str, float], step: Optional[int] = None) -> None: ...
    def log_artifact(self, path: Path, artifact_path: Optional[str] = None) -> None: ...
    def set_tags(self, tags: Mapping[str, str]) -> None: ...


class NullTracker:
    """Discards everything (tests, benchmarks, ``tracking: none``)."""

    def log_params(self, params):
        pass

    def log_metrics(self, metrics, step=None):
        pass

    def log_artifact(self, path, artifact_path=None):
        pass

    def set_tags(self, tags):
        pass
