"""A second store backend: the spans where the OpenTelemetry Collector's ClickHouse exporter wrote them."""
