"""Span records and where they go: OTLP JSON lines (as the OpenTelemetry Collector's file exporter writes
them), or any OpenTelemetry SDK `SpanExporter` (e.g. OTLP/HTTP to a collector).

A simulator makes spans far faster than real time, so nothing here drops spans: sinks are synchronous.
"""

from __future__ import annotations

import gzip
import io
import json
import math
from collections.abc import Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Protocol

from infertrace import semconv

Attributes = dict[str, Any]

SPAN_KIND_INTERNAL = 1
SPAN_KIND_SERVER = 2
SPAN_KIND_CLIENT = 3
STATUS_UNSET = 0
STATUS_ERROR = 2


@dataclass(slots=True)
class SpanRecord:
    trace_id: int  # 128-bit
    span_id: int  # 64-bit
    parent_span_id: int  # 0 for a root span
    name: str
    start_ns: int
    end_ns: int
    attributes: Attributes
    kind: int = SPAN_KIND_INTERNAL
    events: list[tuple[str, int, Attributes]] = field(default_factory=list)  # (name, time ns, attributes)
    status_code: int = STATUS_UNSET
    status_message: str = ""
    links: list[tuple[int, int]] = field(default_factory=list)  # (trace id, span id) of linked spans


class SpanSink(Protocol):
    def export(self, resource: Attributes, spans: Sequence[SpanRecord], scope: str | None = None) -> None:
        """`scope`: the instrumentation scope's name when not the sink's own (an emulated engine's)."""

    def close(self) -> None: ...


# ------------------------------------------------------------------------------------ OTLP JSON encoding
# Spans are encoded by hand rather than through dicts and json.dumps: a simulator writes hundreds of
# thousands of them per simulated hour, and this is several times faster. Tests parse the output with the
# official opentelemetry-proto parser.


def _json_string(text: str) -> str:
    if text.isascii() and text.isprintable() and '"' not in text and "\\" not in text:
        return '"' + text + '"'
    return json.dumps(text, ensure_ascii=False)


def _double(value: float) -> str:
    if not math.isfinite(value):
        raise ValueError(f"OTLP JSON cannot carry the double {value!r}")
    return repr(value)


_INT_ARRAY = '{"arrayValue":{"values":[{"intValue":"%s"}]}}'
_STRING_ARRAY = '{"arrayValue":{"values":[{"stringValue":"%s"}]}}'


def encode_array(values: Sequence[Any]) -> str:
    """An attribute's array value (`arrayValue`) of ints, strings, bools or floats."""
    if not values:
        return '{"arrayValue":{}}'
    first = type(values[0])
    if first is int:
        return _INT_ARRAY % '"},{"intValue":"'.join(map(str, values))
    if first is str:
        joined = "".join(values)
        if joined.isascii() and joined.isprintable() and '"' not in joined and "\\" not in joined:
            return _STRING_ARRAY % '"},{"stringValue":"'.join(values)
        body = ",".join(['{"stringValue":' + _json_string(v) + "}" for v in values])
    elif first is bool:
        body = ",".join(['{"boolValue":true}' if v else '{"boolValue":false}' for v in values])
    elif first is float:
        body = ",".join(['{"doubleValue":' + _double(v) + "}" for v in values])
    else:
        body = ",".join(map(_any_value, values))
    return '{"arrayValue":{"values":[' + body + "]}}"


def _any_value(value: Any) -> str:
    kind = type(value)
    if kind is str:
        return '{"stringValue":' + _json_string(value) + "}"
    if kind is int:
        return '{"intValue":"' + str(value) + '"}'
    if kind is bool:
        return '{"boolValue":true}' if value else '{"boolValue":false}'
    if kind is float:
        return '{"doubleValue":' + _double(value) + "}"
    if kind is list or kind is tuple:
        return encode_array(value)
    if hasattr(value, "tolist"):  # numpy arrays and scalars
        return _any_value(value.tolist())
    raise TypeError(f"cannot encode attribute value of type {kind.__name__}")


_key_prefixes: dict[str, str] = {}  # attribute key -> '{"key":"…","value":'
_names: dict[str, str] = {}  # span or event name -> its JSON string


def _key_prefix(key: str) -> str:
    prefix = _key_prefixes.get(key)
    if prefix is None:
        prefix = _key_prefixes[key] = '{"key":' + _json_string(key) + ',"value":'
    return prefix


def _name(name: str) -> str:
    encoded = _names.get(name)
    if encoded is None:
        encoded = _names[name] = _json_string(name)
    return encoded


def _bool(value: bool) -> str:
    return '{"boolValue":true}' if value else '{"boolValue":false}'


def _string(value: str) -> str:
    return '{"stringValue":' + _json_string(value) + "}"


def _float(value: float) -> str:
    return '{"doubleValue":' + _double(value) + "}"


# A span's attributes have one of a few shapes (keys and value types) per span kind, so each shape is compiled
# once into two format strings. The fast one takes ints as `%d`, floats as `%r` (their repr) and strings as they
# are, inside quotes: it serves when every string of the span needs no escaping and every float is finite, which
# one test over all of them tells (a join, a sum). The other converts each string and float through its encoder
# (escaping, refusing NaN and infinities). Other values (lists, bools) go through their encoder in both. One `%`
# per span instead of string operations per attribute.
_ENCODERS: dict[type, Any] = {str: _string, bool: _bool, float: _float, list: encode_array, tuple: encode_array}
_Shape = tuple[tuple[str, ...], tuple[type, ...]]


@dataclass(frozen=True, slots=True)
class _Template:
    fast: str  # strings raw in quotes, floats as %r
    strings: tuple[int, ...]  # positions of the str values
    floats: tuple[int, ...]  # positions of the float values
    converters: tuple[tuple[int, Any], ...]  # (position, encoder) of the other non-int values
    slow: str  # strings and floats through their encoders, as %s
    slow_converters: tuple[tuple[int, Any], ...]


_templates: dict[_Shape, _Template] = {}


def _template(shape: _Shape) -> _Template:
    fast, slow, strings, floats, converters, slow_converters = [], [], [], [], [], []
    for i, (key, kind) in enumerate(zip(*shape, strict=True)):
        prefix = _key_prefix(key).replace("%", "%%")
        if kind is int:
            fast.append(prefix + '{"intValue":"%d"}}')
            slow.append(fast[-1])
            continue
        slow.append(prefix + "%s}")
        slow_converters.append((i, _ENCODERS.get(kind, _any_value)))
        if kind is str:
            fast.append(prefix + '{"stringValue":"%s"}}')
            strings.append(i)
        elif kind is float:
            fast.append(prefix + '{"doubleValue":%r}}')
            floats.append(i)
        else:
            fast.append(slow[-1])
            converters.append(slow_converters[-1])
    template = _Template(",".join(fast), tuple(strings), tuple(floats), tuple(converters), ",".join(slow),
                         tuple(slow_converters))
    if len(_templates) < 4096:  # shapes are few; a caller with ever-new keys just goes uncached
        _templates[shape] = template
    return template


def encode_attributes(attributes: Mapping[str, Any]) -> str:
    return encode_attribute_values(tuple(attributes), tuple(attributes.values()))


def encode_attribute_values(keys: tuple[str, ...], values: tuple[Any, ...]) -> str:
    """`encode_attributes` of the attributes `keys` → `values` (as many), without building their dict."""
    shape = (keys, tuple(map(type, values)))
    template = _templates.get(shape) or _template(shape)
    fast = True
    if template.strings:
        joined = "".join([values[i] for i in template.strings])
        fast = joined.isascii() and joined.isprintable() and '"' not in joined and "\\" not in joined
    if fast and template.floats:
        fast = math.isfinite(sum([values[i] for i in template.floats]))  # NaN, an infinity (or an overflow)
    converters = template.converters if fast else template.slow_converters
    if converters:
        args = list(values)
        for i, convert in converters:
            args[i] = convert(args[i])
        values = tuple(args)
    return (template.fast if fast else template.slow) % values


def encode_span(span: SpanRecord) -> str:
    parent = ',"parentSpanId":"%016x"' % span.parent_span_id if span.parent_span_id else ""
    events = ""
    if span.events:
        events = ',"events":[' + ",".join([
            '{"timeUnixNano":"%d","name":%s,"attributes":[%s]}' % (t, _name(name), encode_attributes(attrs))
            for name, t, attrs in span.events]) + "]"
    if span.links:
        events += ',"links":[' + ",".join('{"traceId":"%032x","spanId":"%016x"}' % link for link in span.links) + "]"
    status = "{}"
    if span.status_code:
        message = ',"message":' + _json_string(span.status_message) if span.status_message else ""
        status = '{"code":%d%s}' % (span.status_code, message)
    return ('{"traceId":"%032x","spanId":"%016x"%s,"name":%s,"kind":%d,"startTimeUnixNano":"%d",'
            '"endTimeUnixNano":"%d","attributes":[%s]%s,"status":%s}') % (
        span.trace_id, span.span_id, parent, _name(span.name), span.kind, span.start_ns, span.end_ns,
        encode_attributes(span.attributes), events, status)


def attributes_format(keys: Sequence[str], kinds: Sequence[type]) -> str:
    """Attributes of one shape (ints and arrays only) as a %-format: each int a `%d`, each array a `%s` to be given
    as `encode_array(values)`. For a producer of many spans of a few fixed shapes (engine steps), which then builds
    neither attribute dicts nor `SpanRecord`s; `encode_attributes` writes the same bytes from a dict."""
    if not set(kinds) <= {int, list}:
        raise ValueError(f"attributes_format takes ints and arrays only, not {sorted(k.__name__ for k in kinds)}")
    if not keys:
        return ""
    shape = (tuple(keys), tuple(kinds))
    return (_templates.get(shape) or _template(shape)).fast


def span_format(name: str, kind: int = SPAN_KIND_INTERNAL, parent: bool = False, events: bool = False,
                attributes: str = "%s") -> str:
    """A span without links or status as a %-format of its trace id, span id, parent span id (with `parent`), start
    and end (ns), attributes (encoded; or, with `attributes`, the values that %-format of them takes, e.g.
    `attributes_format`'s) and events (with `events`: encoded, `event_format`, comma-separated): the bytes
    `encode_span` writes for such a span."""
    return ('{"traceId":"%%032x","spanId":"%%016x"%s,"name":%s,"kind":%d,"startTimeUnixNano":"%%d",'
            '"endTimeUnixNano":"%%d","attributes":[%s]%s,"status":{}}') % (
        ',"parentSpanId":"%016x"' if parent else "", _name(name).replace("%", "%%"), kind, attributes,
        ',"events":[%s]' if events else "")


def event_format(name: str, keys: Sequence[str]) -> str:
    """An event whose attributes are the ints `keys` as a %-format of its time (ns) and their values."""
    return ('{"timeUnixNano":"%%d","name":%s,"attributes":[' % _name(name).replace("%", "%%")
            + attributes_format(keys, [int] * len(keys)) + "]}")


def string_attribute(key: str, value: str) -> str:
    """One string attribute, encoded."""
    return _key_prefix(key) + _string(value) + "}"


def encode_traces_data(resource: Attributes, spans: Sequence[SpanRecord], scope: str, version: str) -> str:
    """One `TracesData` object, as one line of the Collector's file exporter."""
    return encoded_traces_data(resource, list(map(encode_span, spans)), scope, version)


def encoded_traces_data(resource: Attributes, spans: Sequence[str], scope: str, version: str) -> str:
    """`encode_traces_data` of spans already encoded (`encode_span`)."""
    return (f'{{"resourceSpans":[{{"resource":{{"attributes":[{encode_attributes(resource)}]}},'
            f'"scopeSpans":[{{"scope":{{"name":{json.dumps(scope)},"version":{json.dumps(version)}}},'
            f'"spans":[{",".join(spans)}]}}]}}]}}')


@contextmanager
def lines_out(path: Path) -> Iterator[IO[str]]:
    """A new text file at `path`: gzip when its name ends in .gz (no name and mtime 0 in its header, so that a
    fixed seed gives the same bytes), zstd in .zst (level 1, a checksum per frame: the engine hour's 136 MB of
    spans in 9.8 MB, as small as level 3 and faster), else plain UTF-8."""
    if path.suffix == ".gz":
        with open(path, "wb") as raw, gzip.GzipFile(filename="", fileobj=raw, mode="wb", compresslevel=6,
                                                    mtime=0) as packed, io.TextIOWrapper(packed, "utf-8") as text:
            yield text
    elif path.suffix == ".zst":
        import zstandard  # here: plain and gzip output need not load it

        packer = zstandard.ZstdCompressor(level=1, write_checksum=True)
        with io.TextIOWrapper(packer.stream_writer(open(path, "wb")), "utf-8") as text:  # closes the file
            yield text
    else:
        with open(path, "w", encoding="utf-8") as text:
            yield text


class OtlpJsonLinesWriter:
    """Writes OTLP JSON lines to a file (`.gz`: gzip, `.zst`: zstd), one `TracesData` per export call."""

    def __init__(self, path: str | Path, scope: str = semconv.INSTRUMENTATION_SCOPE,
                 version: str = "0.1.0") -> None:
        self.path = Path(path)
        self.scope, self.version = scope, version
        self.spans_written = 0
        self._closing = ExitStack()
        self._file = self._closing.enter_context(lines_out(self.path))

    def export(self, resource: Attributes, spans: Sequence[SpanRecord], scope: str | None = None) -> None:
        self.export_encoded(resource, list(map(encode_span, spans)), scope)

    def export_encoded(self, resource: Attributes, spans: Sequence[str], scope: str | None = None) -> None:
        """`export` of spans already encoded (`encode_span`): what an `EngineTracer` hands a sink that has this."""
        if spans:
            self._file.write(encoded_traces_data(resource, spans, scope or self.scope,
                                                 self.version if scope is None else ""))
            self._file.write("\n")
            self.spans_written += len(spans)

    def close(self) -> None:
        self._closing.close()


class SdkExporterSink:
    """Hands spans to an OpenTelemetry SDK `SpanExporter` (e.g. `OTLPSpanExporter` for OTLP/HTTP)."""

    def __init__(self, exporter: Any, scope: str = semconv.INSTRUMENTATION_SCOPE, version: str = "0.1.0") -> None:
        from opentelemetry.sdk.trace.export import SpanExportResult
        from opentelemetry.sdk.util.instrumentation import InstrumentationScope

        self.exporter = exporter
        self.scope = InstrumentationScope(scope, version)
        self._success = SpanExportResult.SUCCESS
        self.spans_exported = 0

    def export(self, resource: Attributes, spans: Sequence[SpanRecord], scope: str | None = None) -> None:
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import Event, ReadableSpan
        from opentelemetry.sdk.util.instrumentation import InstrumentationScope
        from opentelemetry.trace import Link, SpanContext, SpanKind, Status, StatusCode, TraceFlags

        res = Resource(resource)
        sampled = TraceFlags(TraceFlags.SAMPLED)
        kinds = {SPAN_KIND_INTERNAL: SpanKind.INTERNAL, SPAN_KIND_SERVER: SpanKind.SERVER,
                 SPAN_KIND_CLIENT: SpanKind.CLIENT}
        readable = []
        for s in spans:
            context = SpanContext(s.trace_id, s.span_id, is_remote=False, trace_flags=sampled)
            parent = (SpanContext(s.trace_id, s.parent_span_id, is_remote=False, trace_flags=sampled)
                      if s.parent_span_id else None)
            attributes = {k: (v.tolist() if hasattr(v, "tolist") else v) for k, v in s.attributes.items()}
            status = Status(StatusCode.ERROR, s.status_message or None) if s.status_code else Status()
            links = [Link(SpanContext(t, i, is_remote=False, trace_flags=sampled)) for t, i in s.links]
            readable.append(ReadableSpan(
                name=s.name, context=context, parent=parent, resource=res, attributes=attributes, links=links,
                events=[Event(n, a, t) for n, t, a in s.events], kind=kinds[s.kind], status=status,
                start_time=s.start_ns, end_time=s.end_ns,
                instrumentation_scope=self.scope if scope is None else InstrumentationScope(scope)))
        if self.exporter.export(readable) is not self._success:
            raise RuntimeError(f"span exporter {type(self.exporter).__name__} failed to export "
                               f"{len(readable)} spans")
        self.spans_exported += len(readable)

    def close(self) -> None:
        self.exporter.shutdown()
