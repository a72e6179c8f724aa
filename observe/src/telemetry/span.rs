//! One request's span: its context (for the engine's `traceparent`), and, when the record is
//! written, its attributes, phase events and end.

use super::*;

/// The span of one proxied request. Lives in its [`RequestRecord`] and ends when that is
/// written.
#[derive(Debug)]
pub struct RequestSpan {
    /// The `tracing` span, in [`Telemetry`]'s dispatcher: held, not read, so that it closes
    /// when the record is dropped, after [`RequestSpan::finish`] has ended the OpenTelemetry
    /// span (closing it first would end that span early).
    pub(super) _span: tracing::Span,
    /// The started OpenTelemetry span, to record into.
    pub(super) context: Context,
    /// The span's identity: the client's trace (or a new one), a new span id, the client's
    /// sampled flag and trace state.
    pub(super) identity: SpanContext,
    /// Wall-clock time of `received`: every phase is placed from this anchor.
    pub(super) start: SystemTime,
    pub(super) received: Instant,
    /// When the request was last forwarded to an engine.
    pub(super) forwarded: Option<Instant>,
    pub(super) operation: &'static str,
}

impl RequestSpan {
    pub fn trace_id(&self) -> TraceId {
        self.identity.trace_id()
    }

    /// The trace id as its `Display` writes it (32 lowercase hex digits), written into `buf`.
    pub fn trace_id_hex<'b>(&self, buf: &'b mut [u8; 32]) -> &'b str {
        hex_into(buf, &self.trace_id().to_bytes());
        // Hex digits: always UTF-8.
        std::str::from_utf8(buf).unwrap_or_default()
    }

    /// The request is being forwarded now (`at`, the end of `queue` and the start of `ttfb`):
    /// puts this span's context into the engine's request `headers`, replacing whatever trace
    /// context the client sent, so the engine continues this trace.
    pub fn forwarding(&mut self, at: Instant, headers: &mut HeaderMap) {
        self.forwarded = Some(at);
        headers.remove(TRACEPARENT);
        headers.remove(TRACESTATE);
        let context = &self.identity;
        if !context.is_valid() {
            return;
        }
        if let Ok(value) = HeaderValue::from_bytes(&traceparent(context)) {
            headers.insert(TRACEPARENT, value);
        }
        let state = context.trace_state().header();
        if !state.is_empty() {
            if let Ok(value) = HeaderValue::from_str(&state) {
                headers.insert(TRACESTATE, value);
            }
        }
    }

    /// Ends the span with the finished record `r`: its name, attributes, phases and status, and
    /// its end at `received + total`.
    pub fn finish(&self, r: &RequestRecord) {
        let span = self.context.span();
        if !span.is_recording() {
            // The client's trace is not sampled: nothing is exported for it.
            return;
        }
        let end = r
            .phases
            .total
            .map_or_else(SystemTime::now, |total| self.at_ms(total));
        // Named like the GenAI conventions: `{operation} {model}`.
        if let Some(model) = &r.model {
            span.update_name(format!("{} {model}", self.operation));
        }
        // HTTP server conventions: a 4xx is the client's error, not this span's.
        let error_type = if r.status >= 500 {
            Some(Value::from(r.status.to_string()))
        } else if r.client_disconnected {
            Some(Value::from("client_disconnected"))
        } else if r.error.is_some() && r.status < 400 {
            // The head said success, then the answer broke (a stream cut mid-way).
            Some(Value::from(r.error_class.unwrap_or("upstream")))
        } else {
            None
        };
        // A client that left is not Switchyard failing; everything else here is.
        let failed = error_type.is_some() && (!r.client_disconnected || r.status >= 500);
        let mut attributes = attributes(self.operation, r);
        if let Some(error_type) = error_type {
            attributes.push(KeyValue::new("error.type", error_type));
        }
        span.set_attributes(attributes);
        self.phases(&span, r, end);
        if failed {
            span.set_status(Status::error(r.error.clone().unwrap_or_default()));
        }
        span.end_with_timestamp(end);
    }

    /// The phases, as timed events on the request span (one span per request to create, queue
    /// and export, not one per phase).
    ///
    /// Those measured on the proxy's clock are placed exactly: stamped at the moment the phase
    /// ended, with its length in `switchyard.duration_ms`, so it began that long before. The
    /// engine's own `prefill` and `decode` are stamped at the span's end, when the proxy learned
    /// them: their lengths are on the engine's clock, which does not say when they began on ours.
    fn phases(&self, span: &SpanRef<'_>, r: &RequestRecord, end: SystemTime) {
        let p = &r.phases;
        let event = |name: &'static str, at: SystemTime, attributes: Vec<KeyValue>| {
            span.add_event_with_timestamp(name, at, attributes);
        };
        let proxy_clock = |name: &'static str, at: SystemTime, phase_ms: f64| {
            event(name, at, vec![KeyValue::new(DURATION_MS, phase_ms)]);
        };
        if let Some(forwarded) = self.forwarded.map(|at| self.at(at)) {
            if let Some(queue) = p.queue {
                proxy_clock("queue", forwarded, queue);
            }
            if let Some(ttfb) = p.ttfb {
                proxy_clock("ttfb", forwarded + ms(ttfb), ttfb);
            }
        }
        if let Some(ttft) = p.ttft {
            proxy_clock("ttft", self.at_ms(ttft), ttft);
        }
        for (name, phase) in [("prefill", p.prefill), ("decode", p.decode)] {
            let Some(phase) = phase else { continue };
            let at = match (name, phase.source, p.ttft) {
                // Measured from the stream: first token (the end of ttft) → last token.
                ("decode", Source::Measured, Some(ttft)) => self.at_ms(ttft) + ms(phase.ms),
                _ => end,
            };
            let source = match phase.source {
                Source::Engine => "engine",
                Source::Measured => "measured",
            };
            let mut attributes = vec![
                KeyValue::new(DURATION_MS, phase.ms),
                KeyValue::new("switchyard.source", source),
            ];
            if let Some(tokens) = phase.tokens {
                attributes.push(KeyValue::new("switchyard.tokens", int(tokens)));
            }
            event(name, at, attributes);
        }
    }

    /// The wall-clock time `phase_ms` milliseconds after the request head arrived.
    fn at_ms(&self, phase_ms: f64) -> SystemTime {
        self.start + ms(phase_ms)
    }

    /// The wall-clock time of `instant`, on the request's clock.
    fn at(&self, instant: Instant) -> SystemTime {
        self.start + instant.saturating_duration_since(self.received)
    }
}

/// The request span's attributes: GenAI and HTTP conventions, then Switchyard's identity.
fn attributes(operation: &'static str, r: &RequestRecord) -> Vec<KeyValue> {
    let text = |s: &std::sync::Arc<str>| Value::String(s.clone().into());
    let mut a = Vec::with_capacity(20);
    a.push(KeyValue::new("gen_ai.operation.name", operation));
    if let Some(model) = &r.model {
        a.push(KeyValue::new("gen_ai.request.model", text(model)));
    }
    if let Some(engine) = &r.engine {
        // `kind/build`: the kind is the provider (`llama.cpp`, `mlx`, `openai`).
        let kind = engine.split('/').next().unwrap_or(engine);
        a.push(KeyValue::new("gen_ai.provider.name", kind.to_owned()));
        a.push(KeyValue::new("switchyard.engine", text(engine)));
    }
    if let Some(facts) = &r.facts {
        if let Some(model) = &facts.model {
            a.push(KeyValue::new("gen_ai.response.model", model.clone()));
        }
        if let Some(n) = facts.usage.prompt_tokens {
            a.push(KeyValue::new("gen_ai.usage.input_tokens", int(n)));
        }
        if let Some(n) = facts.usage.completion_tokens {
            a.push(KeyValue::new("gen_ai.usage.output_tokens", int(n)));
        }
    }
    a.push(KeyValue::new(
        "http.request.method",
        r.method.as_str().to_owned(),
    ));
    a.push(KeyValue::new("url.path", r.path.clone()));
    if r.status != 0 {
        a.push(KeyValue::new(
            "http.response.status_code",
            i64::from(r.status),
        ));
    }
    a.push(KeyValue::new("switchyard.request_id", r.id.clone()));
    if let Some(key) = &r.client_key {
        a.push(KeyValue::new("switchyard.client_key", text(key)));
    }
    if let Some(backend) = &r.backend {
        a.push(KeyValue::new("switchyard.backend", text(backend)));
        a.push(KeyValue::new("switchyard.variant", r.variant));
    }
    if let Some(artifact) = &r.artifact {
        a.push(KeyValue::new("switchyard.artifact", text(artifact)));
    }
    if let Some(fingerprint) = &r.fingerprint {
        a.push(KeyValue::new(
            "switchyard.workload",
            fingerprint.workload.clone(),
        ));
    }
    if let Some(warm) = r.warm {
        a.push(KeyValue::new("switchyard.warm", warm));
    }
    a.push(KeyValue::new("switchyard.streamed", r.streamed));
    a.push(KeyValue::new(
        "switchyard.client_disconnected",
        r.client_disconnected,
    ));
    a
}

fn ms(phase_ms: f64) -> Duration {
    Duration::try_from_secs_f64(phase_ms / 1000.0).unwrap_or_default()
}

fn int(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// `00-{trace id}-{span id}-{flags}`: what `TraceContextPropagator` injects (only the sampled
/// flag), written without the formatting machinery, on every forwarded request.
pub(super) fn traceparent(context: &SpanContext) -> [u8; 55] {
    let mut out = [b'-'; 55];
    let flags = (context.trace_flags() & TraceFlags::SAMPLED).to_u8();
    let fields: [(usize, &[u8]); 4] = [
        (0, &[0]),
        (3, &context.trace_id().to_bytes()),
        (36, &context.span_id().to_bytes()),
        (53, &[flags]),
    ];
    for (at, bytes) in fields {
        hex_into(&mut out[at..], bytes);
    }
    out
}

/// Writes `bytes` as lowercase hex into the start of `out` (two digits a byte).
fn hex_into(out: &mut [u8], bytes: &[u8]) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    for (i, byte) in bytes.iter().enumerate() {
        out[2 * i] = HEX[usize::from(byte >> 4)];
        out[2 * i + 1] = HEX[usize::from(byte & 0x0f)];
    }
}
