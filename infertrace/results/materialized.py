"""Where materialised results live and how they are keyed, written and read.

    DIR/derived/results/<analysis>/<key>/result.parquet     the result, its large lists left empty (one row)
    DIR/derived/results/<analysis>/<key>/<field>.parquet    each large list of a result (e.g. the ITL stalls),
                                                            one row per item, typed columns

`<key>` hashes the names of the snapshot's segments (names are content hashes, so the key names exactly the
data the result came from) with the version of the analysis code (a hash of the analyzers' and relations'
source). A result directory is written under a temporary name and renamed into place: a reader sees a whole
result or none. The last few keys per analysis are kept, so a reader on an older snapshot still finds its own.

`DIR/derived/latest.json` names the newest snapshot whose every result (and report document) is written, by its
segments' paths and the time its newest segment was written: while a new snapshot is being materialised, the
dashboard shows that one, saying how far behind it is, instead of computing everything again on each new segment.

`INFERTRACE_RESULTS=live` bypasses all of it (every result computed, nothing read or written): the benchmark
compares both paths with it.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import logging
import os
import shutil
import time
import typing
from collections.abc import Callable, Iterable
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.parquet as pq

from infertrace.results.codec import decode, decode_column, encode, encode_column

if TYPE_CHECKING:
    from infertrace.store.store import Store

log = logging.getLogger(__name__)

RESULTS_DIR = Path("derived") / "results"
LATEST = Path("derived") / "latest.json"
KEEP = 3  # result keys kept per analysis
LIVE_ENV = "INFERTRACE_RESULTS"


def _analysis(module: str, function: str) -> Callable[[Store], Any]:
    """An analyzer, imported when first run (the dashboard imports only what its pages use)."""

    def compute(store: Store) -> Any:
        import importlib

        return getattr(importlib.import_module(module), function)(store)

    compute.__name__ = function
    return compute


# Each analysis with its default parameters, as the dashboard and an unfiltered report use it.
ANALYSES: dict[str, Callable[[Store], Any]] = {
    "slo": _analysis("infertrace.analyzers.slo", "slo_summary"),
    "itl": _analysis("infertrace.analyzers.itl", "analyze_itl"),
    "rca": _analysis("infertrace.analyzers.rca", "analyze_incidents"),
    "prefix_cache": _analysis("infertrace.analyzers.prefix_cache", "analyze_prefix_cache"),
    "ttft": _analysis("infertrace.analyzers.ttft", "analyze_ttft"),
    "roofline": _analysis("infertrace.analyzers.roofline", "analyze_prefill_roofline"),
}


_CODE = {  # what each kind of derived data depends on: (folder of the infertrace package, files)
    "relations": (("store", "relations/*.sql"),),
    "results": (("analyzers", "*.py"), ("analyzers", "sql/*.sql"), ("store", "relations/*.sql"), ("results", "*.py"),
                ("sources", "*.py"),
                # the documents built from the results: the report's and the metrics endpoint's
                ("report", "*.py"), ("export", "*.py"), ("export", "sql/*.sql")),
}


@functools.cache
def code_version(kind: str = "results") -> str:
    """A hash of the code that derived data depends on: for results, the analyzers (Python and SQL), the
    relations' SQL, this package, the source profiles (`infertrace.sources`) and the code of the report and
    metrics documents built from them; for relations, their SQL. The files are read, not imported (a metrics
    endpoint has no use for the report's imports)."""
    package = Path(str(resources.files("infertrace")))
    digest = hashlib.sha256()
    for folder, pattern in _CODE[kind]:
        for path in sorted((package / folder).glob(pattern)):
            digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:16]


def snapshot_key(store: Store, kind: str = "results") -> str:
    """The key of the store's current snapshot: its segments' names and the version of the code `kind` of
    derived data (results, relations) depends on; for results also the `--components` rules registered on the
    store's connection (they name the components RCA ranks), so results under other rules are never read."""
    rules = ""
    if kind == "results":
        from infertrace.sources.components import registered

        rules = repr(registered(store))
    return segments_key([p.name for p in store.segments], kind, rules)


def segments_key(names: Iterable[str], kind: str = "results", rules: str = "") -> str:
    """`snapshot_key` from the segments' names alone (no store opened); `rules` as `snapshot_key` gives them
    (empty: none registered)."""
    digest = hashlib.sha256(code_version(kind).encode())
    if rules and rules != "()":
        digest.update(b"\0rules\0" + rules.encode())
    for name in sorted(names):
        digest.update(b"\n" + name.encode())
    return digest.hexdigest()[:24]


def is_live() -> bool:
    return os.environ.get(LIVE_ENV, "").strip().lower() == "live"


# ------------------------------------------------------------------------------------ large lists
def _arrow_type(hint: Any) -> pa.DataType | None:
    """The Arrow type a value of this annotation is stored as; None when it has none (then JSON text)."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, __import__("types").UnionType):
        options = [a for a in args if a is not type(None)]
        return _arrow_type(options[0]) if len(options) == 1 else None
    simple = {int: pa.int64(), float: pa.float64(), str: pa.string(), bool: pa.bool_()}
    if hint in simple:
        return simple[hint]
    if origin is tuple and len(args) == 2 and args[1] is Ellipsis:
        item = _arrow_type(args[0])
        return pa.list_(item) if item is not None else None
    if dataclasses.is_dataclass(hint):
        hints = typing.get_type_hints(hint)
        fields = [(f.name, _arrow_type(hints[f.name])) for f in dataclasses.fields(hint)]
        if any(t is None for _, t in fields):
            return None
        return pa.struct(fields)  # type: ignore[arg-type]
    return None


def _large_fields(cls: type) -> list[tuple[str, Any]]:
    """The fields of a result that are lists of dataclasses (stalls, culprits, …): stored as tables."""
    hints = typing.get_type_hints(cls)
    out = []
    for f in dataclasses.fields(cls):
        hint = hints[f.name]
        args = typing.get_args(hint)
        if typing.get_origin(hint) is tuple and len(args) == 2 and args[1] is Ellipsis \
                and dataclasses.is_dataclass(args[0]):
            out.append((f.name, args[0]))
    return out


def _items_table(items: tuple[Any, ...], item_type: Any) -> pa.Table:
    struct = _arrow_type(item_type)
    if struct is None:  # no Arrow type for some field (e.g. a dict): one JSON text per item
        return pa.table({"json": pa.array([json.dumps(encode(i)) for i in items], pa.string())})
    if not items:
        return pa.schema(list(struct)).empty_table()
    return pa.Table.from_struct_array(encode_column(items, item_type, struct))


def _items(table: pa.Table, item_type: Any) -> tuple[Any, ...]:
    if table.column_names == ["json"]:
        return tuple(decode(json.loads(text), item_type) for text in table["json"].to_pylist())
    if table.num_rows == 0:
        return ()
    return tuple(decode_column(table.to_struct_array(), item_type))


# ------------------------------------------------------------------------------------ read and write
def _folder(store: Store, name: str) -> Path:
    return store.root / RESULTS_DIR / name


def load(store: Store, name: str, cls: type | None = None) -> Any | None:
    """The analysis result stored for the store's snapshot, or None when there is none."""
    folder = _folder(store, name) / snapshot_key(store)
    head = folder / "result.parquet"
    if not head.is_file():
        return None
    try:
        table = pq.read_table(head)
        meta = json.loads(table["meta"][0].as_py())
        cls = cls or _result_class(meta["class"])
        data = json.loads(table["result"][0].as_py())
        value = decode(data, cls)
        large = {field: _items(pq.read_table(folder / f"{field}.parquet"), item)
                 for field, item in _large_fields(cls)}
        return dataclasses.replace(value, **large) if large else value
    except (OSError, ValueError, KeyError, TypeError, pa.ArrowException) as e:
        log.warning("materialised %s result in %s unreadable (%s): computing it again", name, folder, e)
        return None


def _result_class(qualified: str) -> type:
    import importlib

    module, _, name = qualified.rpartition(".")
    if not module.startswith("infertrace.analyzers."):
        raise ValueError(f"{qualified} is not an analyzer result")
    cls = getattr(importlib.import_module(module), name)
    if not dataclasses.is_dataclass(cls):
        raise ValueError(f"{qualified} is not a dataclass")
    return cls


def save(store: Store, name: str, value: Any, seconds: float) -> Path:
    """Writes a result for the store's snapshot (atomically: a temporary directory renamed into place)."""
    key = snapshot_key(store)
    parent = _folder(store, name)
    parent.mkdir(parents=True, exist_ok=True)
    final = parent / key
    temporary = parent / f".{key}.tmp-{os.getpid()}"
    shutil.rmtree(temporary, ignore_errors=True)
    temporary.mkdir()
    cls = type(value)
    large = _large_fields(cls)
    head = dataclasses.replace(value, **{field: () for field, _ in large}) if large else value
    for field, item in large:
        pq.write_table(_items_table(getattr(value, field), item), temporary / f"{field}.parquet")
    meta = {"analysis": name, "class": f"{cls.__module__}.{cls.__qualname__}", "code_version": code_version(),
            "segments": sorted(p.name for p in store.segments), "compute_seconds": round(seconds, 3)}
    pq.write_table(pa.table({"meta": [json.dumps(meta)], "result": [json.dumps(encode(head))]}),
                   temporary / "result.parquet")
    try:
        temporary.rename(final)
    except OSError:  # another process wrote the same key first: theirs is the same result
        shutil.rmtree(temporary, ignore_errors=True)
    _prune(parent)
    return final


def _prune(parent: Path) -> None:
    results = sorted((p for p in parent.iterdir() if p.is_dir() and not p.name.startswith(".")),
                     key=lambda p: p.stat().st_mtime, reverse=True)
    for old in results[KEEP:]:
        shutil.rmtree(old, ignore_errors=True)


def result(store: Store, name: str) -> Any:
    """The analysis result for the store's snapshot: read when materialised, else computed and written."""
    compute = ANALYSES[name]
    if is_live():
        return compute(store)
    value = load(store, name)
    if value is not None:
        return value
    started = time.perf_counter()
    value = compute(store)
    seconds = time.perf_counter() - started
    try:
        save(store, name, value, seconds)
    except OSError as e:  # a read-only store: the result is still right, only not kept
        log.warning("cannot keep the %s result in %s: %s", name, store.root, e)
    return value


REPORT = "report"  # the unfiltered report's document, built from the results above


METRICS = "metrics"  # the metrics endpoint's exposition (Prometheus text format), built from the results above


def _load_text(root: Path, name: str, segment_names: Iterable[str]) -> str | None:
    """A document (`REPORT`, `METRICS`) of the snapshot with these segments, or None; reads one small file and
    opens no store."""
    path = Path(root) / RESULTS_DIR / name / segments_key(segment_names) / "result.parquet"
    if is_live() or not path.is_file():
        return None
    try:
        return str(pq.read_table(path)["result"][0].as_py())
    except (OSError, ValueError, KeyError, pa.ArrowException) as e:
        log.warning("materialised %s %s unreadable (%s): building it again", name, path, e)
        return None


def _save_text(store: Store, name: str, text: str) -> None:
    """Keeps a document of the store's snapshot (atomically, as results are kept); nothing with
    INFERTRACE_RESULTS=live."""
    if is_live():
        return
    parent = _folder(store, name)
    parent.mkdir(parents=True, exist_ok=True)
    key = snapshot_key(store)
    temporary = parent / f".{key}.tmp-{os.getpid()}"
    shutil.rmtree(temporary, ignore_errors=True)
    temporary.mkdir()
    meta = {"analysis": name, "code_version": code_version(), "segments": sorted(p.name for p in store.segments)}
    pq.write_table(pa.table({"meta": [json.dumps(meta)], "result": [text]}), temporary / "result.parquet")
    try:
        temporary.rename(parent / key)
    except OSError:
        shutil.rmtree(temporary, ignore_errors=True)
    _prune(parent)


def load_report(root: Path, segment_names: Iterable[str]) -> dict[str, Any] | None:
    """The unfiltered report document of the snapshot with these segments, or None; reads one small file and
    opens no store, so `infertrace report` answers at once."""
    text = _load_text(root, REPORT, segment_names)
    try:
        return json.loads(text) if text is not None else None
    except ValueError as e:
        log.warning("materialised report of %s unreadable (%s): building it again", root, e)
        return None


def save_report(store: Store, doc: dict[str, Any]) -> None:
    """Keeps the unfiltered report document of the store's snapshot."""
    _save_text(store, REPORT, json.dumps(doc))


def load_metrics(root: Path, segment_names: Iterable[str]) -> str | None:
    """The metrics exposition of the snapshot with these segments, or None; opens no store."""
    return _load_text(root, METRICS, segment_names)


def save_metrics(store: Store, text: str) -> None:
    """Keeps the metrics exposition of the store's snapshot (`infertrace.export.metrics.exposition_text`)."""
    _save_text(store, METRICS, text)


@dataclasses.dataclass(frozen=True)
class Materialised:
    """A snapshot whose every result is materialised: its segments (paths relative to the store directory) and
    when its newest segment was written (Unix seconds): the analysis covers the spans stored up to then."""

    segments: tuple[str, ...]
    data_until: float


def is_materialised(root: Path, segment_names: Iterable[str]) -> bool:
    """Whether the snapshot with these segment names has every result (the report and metrics documents, built
    from the others, are written last)."""
    key = segments_key(segment_names)
    return not is_live() and all((Path(root) / RESULTS_DIR / name / key / "result.parquet").is_file()
                                 for name in (REPORT, METRICS))


def latest(root: Path) -> Materialised | None:
    """The newest snapshot with every result materialised (`materialize` records it), or None."""
    path = Path(root) / LATEST
    try:
        doc = json.loads(path.read_text())
        found = Materialised(tuple(str(s) for s in doc["segments"]), float(doc["data_until"]))
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError) as e:
        log.warning("%s unreadable (%s): no materialised snapshot to show", path, e)
        return None
    if not is_materialised(root, (Path(s).name for s in found.segments)):
        return None  # its results were pruned, or the code that computed them changed
    return found


def _record_latest(store: Store) -> None:
    """Records the store's snapshot as the newest materialised one, unless a newer one is recorded already (two
    materialisations may finish out of order)."""
    data_until = store.written_until()
    previous = latest(store.root)
    if previous is not None and previous.data_until > data_until:
        return
    path = store.root / LATEST
    temporary = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    temporary.write_text(json.dumps({"segments": list(store.segment_paths()), "data_until": data_until}))
    os.replace(temporary, path)


def materialize(store: Store, names: Iterable[str] = ANALYSES,
                on_progress: Callable[[str], None] | None = None) -> dict[str, float]:
    """Computes and writes the snapshot's derived relations and every named analysis it has no result for
    (the analyses then read the written relations); returns the seconds each took (0.0 for one already
    there). An empty store gets none."""
    from infertrace.results.relations import attach, materialize_relations

    spent: dict[str, float] = {}
    if not store.segments:
        return spent
    names = tuple(names)
    everything = set(names) == set(ANALYSES)  # then also the documents built from them, and latest.json
    if on_progress is not None:
        on_progress("relations")
    spent["relations"] = materialize_relations(store)
    attach(store)
    computed: dict[str, Any] = {}  # the results computed here, for the report (reading them back costs seconds)
    for name in names:
        if on_progress is not None:
            on_progress(name)
        if load(store, name) is not None:
            spent[name] = 0.0
            continue
        started = time.perf_counter()
        value = computed[name] = ANALYSES[name](store)
        spent[name] = time.perf_counter() - started
        save(store, name, value, spent[name])
        log.info("materialised %s in %.2f s", name, spent[name])
    if everything and load_report(store.root, (p.name for p in store.segments)) is None:
        from infertrace.report import build_report

        if on_progress is not None:
            on_progress(REPORT)
        started = time.perf_counter()
        results = {name: computed[name] if name in computed else result(store, name) for name in ANALYSES}
        results["cache"] = results.pop("prefix_cache")
        save_report(store, build_report(store, **results))
        spent[REPORT] = time.perf_counter() - started
    if everything and load_metrics(store.root, (p.name for p in store.segments)) is None:
        from infertrace.export.metrics import exposition_text

        if on_progress is not None:
            on_progress(METRICS)
        started = time.perf_counter()
        itl = computed["itl"] if "itl" in computed else result(store, "itl")
        cache = computed["prefix_cache"] if "prefix_cache" in computed else result(store, "prefix_cache")
        save_metrics(store, exposition_text(store, itl, cache))
        spent[METRICS] = time.perf_counter() - started
    if everything and not is_live():
        from infertrace.sources.components import registered

        if not registered(store):  # the dashboard shows rule-less results unless started with --components
            try:
                _record_latest(store)
            except OSError as e:
                log.warning("cannot record the materialised snapshot in %s: %s", store.root, e)
    return spent
