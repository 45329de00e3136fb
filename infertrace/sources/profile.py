"""What a telemetry source is, as data: the spans it exports and their attributes, its clocks, how it can be
told apart, where in its code each fact was read (repository, file, commit), and what it leaves out."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Citation:
    repo: str
    path: str
    commit: str  # 40 hex digits; "" where the copy read carried none (said in `what`)
    what: str  # what was read there

    def text(self) -> str:
        at = f"@{self.commit[:12]}" if self.commit else ""
        return f"{self.repo}:{self.path}{at} ({self.what})"


@dataclass(frozen=True)
class SpanShape:
    name: str
    kind: str  # SERVER, INTERNAL, ...
    covers: str  # when it starts and ends
    attributes: tuple[tuple[str, str, str], ...] = ()  # (key, type, meaning and clock)


@dataclass(frozen=True)
class SourceProfile:
    name: str  # the `requests.source` value, and `simulate --telemetry` profile
    title: str
    export: str  # how it exports: protocol, endpoint flag, environment
    resource: str  # what its resource carries: identity
    spans: tuple[SpanShape, ...]
    clocks: str
    normalised: tuple[str, ...]  # relations it feeds
    missing: tuple[str, ...]  # what it does not export that analyses would want
    citations: tuple[Citation, ...]
