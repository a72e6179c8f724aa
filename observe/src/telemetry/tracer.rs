//! The tracer `tracing-opentelemetry` starts request spans with: the SDK's, taught one thing,
//! to date a span from when its request head arrived rather than from when the `tracing` span
//! was created.
//!
//! `tracing-opentelemetry` stamps a span's start with the clock at the `tracing` span's
//! creation, and offers no way to set it. The request span is created as soon as the record
//! exists, a little after the head arrived, yet its phases (`ttft`, `total`) count from the
//! arrival: the span must start exactly there. The request span carries the arrival as the
//! field [`ARRIVED`] (nanoseconds since the Unix epoch); when the layer hands the span's
//! builder to this tracer, the field is taken out of the attributes and becomes the start time.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use opentelemetry::trace::{SpanBuilder, Tracer};
use opentelemetry::{Context, Value};
use opentelemetry_sdk::trace::{SdkTracer, Span};

/// The request span's field holding when its request head arrived, in nanoseconds since the
/// Unix epoch; never exported as an attribute.
pub(super) const ARRIVED: &str = "switchyard.arrived_unix_nano";

/// The SDK's tracer, starting each span at its [`ARRIVED`] time when it has one.
#[derive(Debug, Clone)]
pub(super) struct ArrivalTracer(pub(super) SdkTracer);

impl Tracer for ArrivalTracer {
    type Span = Span;

    fn build_with_context(&self, mut builder: SpanBuilder, parent_cx: &Context) -> Span {
        if let Some(attributes) = builder.attributes.as_mut() {
            if let Some(at) = attributes.iter().position(|kv| kv.key.as_str() == ARRIVED) {
                if let Value::I64(nanos) = attributes.remove(at).value {
                    let since_epoch = Duration::from_nanos(u64::try_from(nanos).unwrap_or(0));
                    builder.start_time = Some(UNIX_EPOCH + since_epoch);
                }
            }
        }
        self.0.build_with_context(builder, parent_cx)
    }
}

/// `at` in nanoseconds since the Unix epoch, as [`ARRIVED`] holds it.
pub(super) fn unix_nanos(at: SystemTime) -> i64 {
    at.duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX))
}
