//! The trace exporter's span counts, written with the rest of the exposition.

use prometheus_client::encoding::prometheus_text;
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::registry::Registry;

/// The trace exporter's counts of request spans, read at each scrape when traces are on.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SpanCounts {
    /// Spans in batches the collector accepted.
    pub exported: u64,
    /// Spans dropped because the export queue was full.
    pub dropped: u64,
    /// Spans in batches whose export failed.
    pub failed: u64,
}

impl SpanCounts {
    /// Writes `switchyard_trace_spans_{exported,dropped,failed}_total` to `out`, in the format of
    /// the rest of the exposition.
    pub(super) fn encode(self, out: &mut String) -> std::fmt::Result {
        let mut registry = Registry::default();
        for (name, help, value) in [
            (
                "switchyard_trace_spans_exported",
                "Request spans the OTLP collector accepted",
                self.exported,
            ),
            (
                "switchyard_trace_spans_dropped",
                "Request spans dropped because the export queue was full",
                self.dropped,
            ),
            (
                "switchyard_trace_spans_failed",
                "Request spans in exports that failed",
                self.failed,
            ),
        ] {
            registry.register(name, help, ConstCounter::new(value));
        }
        prometheus_text::encode(out, &registry)
    }
}
