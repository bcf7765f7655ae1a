"""An OTLP/HTTP receiver for the tests, decoding with the official
``opentelemetry-proto`` messages (what the OpenTelemetry Collector's own OTLP receiver
accepts).

Usage::

    python otlp.py DIR

It listens on 127.0.0.1 (a free port, written to ``DIR/port`` once it listens) for
``POST /v1/traces`` and ``POST /v1/metrics`` with ``Content-Type:
application/x-protobuf``, answers each with the empty export response, keeps each
request's raw body as ``DIR/raw-N.bin`` (for the tests to search every exported byte)
and appends one JSON line per span to ``DIR/spans.jsonl`` (its resource's and scope's
names, trace, span and parent ids in hex, name, kind, attributes, links and status) and
one per metric data point to ``DIR/metrics.jsonl`` (scope, metric name, kind, unit,
attributes, and the value: a gauge's or sum's number, a histogram's count and sum).
Anything else is answered 404 or 415. It runs until killed.
"""

from __future__ import annotations

import http.server
import itertools
import json
import sys
import threading
from pathlib import Path
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span, Status

OUT = Path(sys.argv[1])
COUNT = itertools.count()
LOCK = threading.Lock()


def value(any_value: AnyValue) -> Any:
    """An attribute's value as JSON."""
    kind = any_value.WhichOneof("value")
    if kind == "array_value":
        return [value(item) for item in any_value.array_value.values]
    return getattr(any_value, kind) if kind else None


def attributes(pairs: Any) -> dict[str, Any]:
    return {pair.key: value(pair.value) for pair in pairs}


def number(point: Any) -> Any:
    """A number data point's value."""
    return point.as_int if point.WhichOneof("value") == "as_int" else point.as_double


def metric_lines(body: bytes) -> tuple[list[dict[str, Any]], bytes]:
    """One line per data point of an ExportMetricsServiceRequest, and the answer."""
    request = ExportMetricsServiceRequest()
    request.ParseFromString(body)
    lines = []
    for resource_metrics in request.resource_metrics:
        for scope_metrics in resource_metrics.scope_metrics:
            for metric in scope_metrics.metrics:
                kind = metric.WhichOneof("data")
                data = getattr(metric, kind)
                for point in data.data_points:
                    line = {
                        "scope": scope_metrics.scope.name,
                        "name": metric.name,
                        "kind": kind,
                        "unit": metric.unit,
                        "attributes": attributes(point.attributes),
                    }
                    if kind == "histogram":
                        line.update(count=point.count, sum=point.sum)
                    else:
                        line["value"] = number(point)
                    lines.append(line)
    return lines, ExportMetricsServiceResponse().SerializeToString()


class Receiver(http.server.BaseHTTPRequestHandler):
    def do_POST(self) -> None:  # noqa: N802 (the standard library's name)
        if self.path not in ("/v1/traces", "/v1/metrics"):
            self.send_error(404)
            return
        if self.headers.get("Content-Type") != "application/x-protobuf":
            self.send_error(415)
            return
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        if self.path == "/v1/metrics":
            lines, answer = metric_lines(body)
            self.keep(body, "metrics.jsonl", lines)
            self.answer(answer)
            return
        request = ExportTraceServiceRequest()
        request.ParseFromString(body)
        lines = []
        for resource_spans in request.resource_spans:
            resource = attributes(resource_spans.resource.attributes)
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    lines.append(
                        {
                            "service": resource.get("service.name"),
                            "scope": scope_spans.scope.name,
                            "trace_id": span.trace_id.hex(),
                            "span_id": span.span_id.hex(),
                            "parent_span_id": span.parent_span_id.hex(),
                            "name": span.name,
                            "kind": Span.SpanKind.Name(span.kind),
                            "attributes": attributes(span.attributes),
                            "links": [
                                {"trace_id": link.trace_id.hex(), "span_id": link.span_id.hex()}
                                for link in span.links
                            ],
                            "status": Status.StatusCode.Name(span.status.code),
                        }
                    )
        self.keep(body, "spans.jsonl", lines)
        self.answer(ExportTraceServiceResponse().SerializeToString())

    def keep(self, body: bytes, name: str, lines: list[dict[str, Any]]) -> None:
        """The raw body, and the decoded lines appended to ``name``."""
        with LOCK:
            (OUT / f"raw-{next(COUNT)}.bin").write_bytes(body)
            with open(OUT / name, "a", encoding="utf-8") as out:
                for line in lines:
                    out.write(json.dumps(line) + "\n")

    def answer(self, answer: bytes) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
        pass


def main() -> None:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Receiver)
    port_file = OUT / "port"
    port_file.with_suffix(".tmp").write_text(str(server.server_address[1]))
    port_file.with_suffix(".tmp").rename(port_file)
    server.serve_forever()


if __name__ == "__main__":
    main()
