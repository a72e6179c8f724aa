//! Sending one request of the shadows' own to a backend ([`run_on`]): a shadow's copy, a
//! replay's side, a golden probe or a `switchyard compare` request, each recorded as a request of
//! its own, and its answer read to the end.

use std::sync::Arc;
use std::time::Instant;

use http::HeaderValue;
use http_body_util::BodyExt;
use switchyard_adapters::fingerprint::WorkloadFingerprint;
use switchyard_engine::Backend;
use switchyard_policy::compare::Side;
use switchyard_record::RequestRecord;
use tokio::sync::oneshot;
use tower::ServiceExt as _;

use super::skip::not_ready;
use crate::forward::{Attempt, BackendStack, Ctx, Outgoing};
use crate::sinks::{Recorder, Recording};

/// A backend with its stack: a shadow's, or one a request is tried on.
#[derive(Debug, Clone)]
pub(crate) struct Candidate {
    pub(crate) backend: Arc<Backend>,
    pub(crate) stack: BackendStack,
}

/// A request [`run_on`] ran: its side, as its record has it, and, when the backend refused it
/// before anything was sent because it was not ready for it, the refusal's code
/// ([`not_ready`]).
pub(crate) struct Ran {
    pub(crate) side: Side,
    pub(crate) not_ready: Option<&'static str>,
    /// The answer's body, when it was asked for (`keep_body`) and came whole within
    /// [`KEPT_BODY_BYTES`].
    pub(crate) body: Option<bytes::Bytes>,
    /// What the record has beyond the side: the wait for a managed engine's start (`load`)
    /// and the error's class.
    pub(crate) load_ms: Option<f64>,
    pub(crate) error_class: Option<&'static str>,
}

/// The most of an answer [`run_on`] keeps when asked to: a replay's answer with the
/// alternatives of each of its tokens is tens of kilobytes.
const KEPT_BODY_BYTES: usize = 8 << 20;

/// Runs one request on `candidate` as its own recorded request (variant `variant`), reads the
/// answer to its end (keeping it when `keep_body`), and returns the outcome. Used by shadows,
/// replays, golden probes and `switchyard compare`.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn run_on(
    recorder: &Arc<Recorder>,
    candidate: &Candidate,
    variant: &'static str,
    outgoing: &Arc<Outgoing>,
    model: &Arc<str>,
    fingerprint: &WorkloadFingerprint,
    streamed: bool,
    warm: Option<bool>,
    keep_body: bool,
) -> Ran {
    let id = ulid::Ulid::new().to_string();
    let header_id = HeaderValue::from_str(&id).unwrap_or(HeaderValue::from_static("shadow"));
    let mut record = RequestRecord::new(
        id,
        outgoing.head.method.clone(),
        outgoing.endpoint.path().to_owned(),
        Instant::now(),
    );
    record.describe(model, fingerprint.clone(), streamed);
    record.warm_override = warm;
    let mut recording = Recording::new(recorder.clone(), record);
    recording.keep_text();
    let (tx, rx) = oneshot::channel();
    recording.set_hook(Box::new(move |record: &RequestRecord| {
        let _ = tx.send((record.side(), record.phases.load, record.error_class));
    }));
    let ctx = Ctx::new(recording, header_id, outgoing.endpoint);
    let attempt = Attempt::new(ctx, outgoing.clone(), variant);
    let mut refused = None;
    let mut kept = keep_body.then(bytes::BytesMut::new);
    match candidate.stack.clone().oneshot(attempt).await {
        Ok(response) => {
            // A streamed answer's record is written when its body ends; read it to the end.
            let mut body = response.into_body();
            while let Some(frame) = body.frame().await {
                let Ok(frame) = frame else {
                    kept = None;
                    break;
                };
                if let (Some(buf), Some(data)) = (kept.as_mut(), frame.data_ref()) {
                    if buf.len() + data.len() > KEPT_BODY_BYTES {
                        kept = None;
                    } else {
                        buf.extend_from_slice(data);
                    }
                }
            }
        }
        Err(failed) => {
            refused = not_ready(&failed.error);
            kept = None;
            let _ = failed.into_response();
        }
    }
    let (side, load_ms, error_class) = rx.await.unwrap_or_else(|_| {
        let side = Side {
            backend: candidate.backend.name.to_string(),
            error: Some("the request's record was not written".to_owned()),
            ..Side::default()
        };
        (side, None, None)
    });
    Ran {
        side,
        not_ready: refused,
        body: kept.map(bytes::BytesMut::freeze),
        load_ms,
        error_class,
    }
}
