"""An OpenTelemetry collector on the loopback, for the tests that read what real processes export.

It takes OTLP/HTTP (protobuf) at ``/v1/traces`` and ``/v1/metrics``, what OpenTelemetry's HTTP exporters
send, and keeps the spans and the metric data points as plain dicts. The opentelemetry-proto package comes
with those exporters (both test environments have them).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

__all__ = ["Received", "otlp_collector"]


@dataclass
class Received:
    """What the collector was sent: spans, metric points, and every request body (to scan for secrets)."""

    url: str = ""
    spans: list[dict[str, Any]] = field(default_factory=list)
    points: list[dict[str, Any]] = field(default_factory=list)
    bodies: list[bytes] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def named(self, name: str) -> list[dict[str, Any]]:
        """The spans named ``name``."""
        with self.lock:
            return [s for s in self.spans if s["name"] == name]

    def metric(self, name: str, **attributes: str) -> list[dict[str, Any]]:
        """The points of metric ``name`` whose attributes include ``attributes``."""
        with self.lock:
            return [
                p
                for p in self.points
                if p["name"] == name and all(p["attributes"].get(k) == v for k, v in attributes.items())
            ]


def _value(any_value: Any) -> Any:
    return getattr(any_value, any_value.WhichOneof("value"))


def _attributes(pairs: Any) -> dict[str, Any]:
    return {a.key: _value(a.value) for a in pairs}


def _spans(body: bytes) -> list[dict[str, Any]]:
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    return [
        {
            "name": span.name,
            "trace_id": span.trace_id.hex(),
            "span_id": span.span_id.hex(),
            "parent": span.parent_span_id.hex(),
            "start": span.start_time_unix_nano,
            "attributes": _attributes(span.attributes),
            "events": [(e.name, _attributes(e.attributes)) for e in span.events],
        }
        for rs in ExportTraceServiceRequest.FromString(body).resource_spans
        for ss in rs.scope_spans
        for span in ss.spans
    ]


def _points(body: bytes) -> list[dict[str, Any]]:
    """Each data point as ``{name, kind, attributes, value | count, sum}`` (sums, gauges, histograms)."""
    from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest

    found = []
    for rm in ExportMetricsServiceRequest.FromString(body).resource_metrics:
        for sm in rm.scope_metrics:
            for metric in sm.metrics:
                kind = metric.WhichOneof("data")
                for point in getattr(metric, kind).data_points:
                    row = {"name": metric.name, "kind": kind, "attributes": _attributes(point.attributes)}
                    if kind == "histogram":
                        row |= {"count": point.count, "sum": point.sum}
                    else:
                        row["value"] = getattr(point, point.WhichOneof("value"))
                    found.append(row)
    return found


def _handler(into: Received) -> type[BaseHTTPRequestHandler]:
    from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceResponse
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["Content-Length"]))
            if self.path.endswith("/v1/traces"):
                spans, points, reply = _spans(body), [], ExportTraceServiceResponse()
            elif self.path.endswith("/v1/metrics"):
                spans, points, reply = [], _points(body), ExportMetricsServiceResponse()
            else:
                self.send_response(404)
                self.end_headers()
                return
            with into.lock:
                into.spans += spans
                into.points += points
                into.bodies.append(body)
            data = reply.SerializeToString()
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: Any) -> None:
            return None

    return Handler


@contextmanager
def otlp_collector() -> Iterator[Received]:
    """A collector on a free loopback port; ``Received.url`` is its base (the exporters add ``/v1/...``)."""
    into = Received()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(into))
    into.url = f"http://127.0.0.1:{server.server_address[1]}"
    serving = threading.Thread(target=server.serve_forever, name="otlp-collector", daemon=True)
    serving.start()
    try:
        yield into
    finally:
        server.shutdown()
        server.server_close()
