-- otel_traces: the span table of the OpenTelemetry Collector's ClickHouse exporter, as the exporter creates it.
--
-- Copied from open-telemetry/opentelemetry-collector-contrib at commit
-- ff7a94656bd04ce95228ff4282554a233ed93434,
-- exporter/clickhouseexporter/internal/sql_templates/traces_table.sql, with the template's placeholders filled
-- as the exporter fills them by default: table `otel_traces` (here qualified by the database, `{database}`),
-- no cluster clause, engine `MergeTree()`, no TTL (`ttl: 0`). The exporter writes each span as one row
-- (exporter_traces.go, same commit): Timestamp = the span's start, Duration = end − start in ns, SpanKind and
-- StatusCode as pdata names them ('Server', 'Client', …; 'Unset', 'Ok', 'Error'), ServiceName =
-- service.name, every resource and span attribute as text in the maps (pcommon `Value.AsString`: strings as
-- they are, integers in decimal, booleans true/false, arrays and maps as JSON).
-- Used by: `infertrace export --to clickhouse://…` (creates the table when missing) and the tests (chdb).
CREATE TABLE IF NOT EXISTS {database}.otel_traces (
    Timestamp DateTime64(9) CODEC(Delta, ZSTD(1)),
    TraceId String CODEC(ZSTD(1)),
    SpanId String CODEC(ZSTD(1)),
    ParentSpanId String CODEC(ZSTD(1)),
    TraceState String CODEC(ZSTD(1)),
    SpanName LowCardinality(String) CODEC(ZSTD(1)),
    SpanKind LowCardinality(String) CODEC(ZSTD(1)),
    ServiceName LowCardinality(String) CODEC(ZSTD(1)),
    ResourceAttributes Map(LowCardinality(String), String) CODEC(ZSTD(1)),
    ScopeName String CODEC(ZSTD(1)),
    ScopeVersion String CODEC(ZSTD(1)),
    SpanAttributes Map(LowCardinality(String), String) CODEC(ZSTD(1)),
    Duration UInt64 CODEC(ZSTD(1)),
    StatusCode LowCardinality(String) CODEC(ZSTD(1)),
    StatusMessage String CODEC(ZSTD(1)),
    Events Nested (
        Timestamp DateTime64(9),
        Name LowCardinality(String),
        Attributes Map(LowCardinality(String), String)
    ) CODEC(ZSTD(1)),
    Links Nested (
        TraceId String,
        SpanId String,
        TraceState String,
        Attributes Map(LowCardinality(String), String)
    ) CODEC(ZSTD(1)),
    INDEX idx_trace_id TraceId TYPE bloom_filter(0.001) GRANULARITY 1,
    INDEX idx_res_attr_key mapKeys(ResourceAttributes) TYPE bloom_filter(0.01) GRANULARITY 1,
    INDEX idx_res_attr_value mapValues(ResourceAttributes) TYPE bloom_filter(0.01) GRANULARITY 1,
    INDEX idx_span_attr_key mapKeys(SpanAttributes) TYPE bloom_filter(0.01) GRANULARITY 1,
    INDEX idx_span_attr_value mapValues(SpanAttributes) TYPE bloom_filter(0.01) GRANULARITY 1,
    INDEX idx_duration Duration TYPE minmax GRANULARITY 1
) ENGINE = MergeTree()
PARTITION BY toDate(Timestamp)
ORDER BY (ServiceName, SpanName, toDateTime(Timestamp))
SETTINGS index_granularity = 8192, ttl_only_drop_parts = 1
