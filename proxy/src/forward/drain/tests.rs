//! Unit tests of the drain: read to its end, cut at its bounds, cancelled once closed, and the
//! stream's hand-off when its client leaves; the record written and the slot released only when
//! the drain is over.

use std::sync::{Arc, Mutex};
use std::time::Instant;

use bytes::Bytes;
use http_body::Frame;
use http_body_util::{BodyExt as _, StreamBody};
use switchyard_record::RequestRecord;
use tokio::sync::{mpsc, oneshot};

use super::{Drain, Drains};
use crate::forward::stream::ObservedStream;
use crate::forward::tests::backend;
use crate::forward::Held;
use crate::sinks::{Recorder, Recording};

type Chunks = mpsc::Sender<Result<Frame<Bytes>, std::io::Error>>;
type Body =
    StreamBody<futures_util::stream::BoxStream<'static, Result<Frame<Bytes>, std::io::Error>>>;

/// A body fed chunk by chunk through the sender.
fn channel_body() -> (Chunks, Body) {
    let (tx, rx) = mpsc::channel(16);
    let stream = futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|item| (item, rx))
    });
    (tx, StreamBody::new(Box::pin(stream) as _))
}

fn data(text: &'static str) -> Result<Frame<Bytes>, std::io::Error> {
    Ok(Frame::data(Bytes::from_static(text.as_bytes())))
}

/// What the written record said: `disconnect`, `client_disconnected`, `total` set.
type Written = (Option<&'static str>, bool, bool);

/// A record whose writing is reported on the receiver.
fn recording(recorder: &Arc<Recorder>) -> (Recording, oneshot::Receiver<Written>) {
    let mut recording = Recording::new(
        recorder.clone(),
        RequestRecord::new(
            "d-1".into(),
            http::Method::POST,
            "/v1/chat/completions".into(),
            Instant::now(),
        ),
    );
    let (tx, rx) = oneshot::channel();
    let tx = Mutex::new(Some(tx));
    recording.set_hook(Box::new(move |r| {
        if let Some(tx) = tx.lock().unwrap().take() {
            let _ = tx.send((
                r.disconnect,
                r.client_disconnected,
                r.phases.total.is_some(),
            ));
        }
    }));
    (recording, rx)
}

fn drain(extra: serde_json::Value) -> (Drain, Drains) {
    let mut config = serde_json::json!({"on_client_disconnect": "drain"});
    config
        .as_object_mut()
        .unwrap()
        .extend(extra.as_object().unwrap().clone());
    let drains = Drains::default();
    let drain = Drain::of(&backend("d", config), &drains).expect("the backend drains");
    (drain, drains)
}

fn held(recorder: &Recorder) -> Option<Held> {
    Some(Held {
        permit: None,
        lease: None,
        in_flight: recorder.metrics.in_flight("d"),
        occupancy: None,
    })
}

#[test]
fn a_backend_that_cancels_has_no_drain() {
    assert!(Drain::of(&backend("c", serde_json::json!({})), &Drains::default()).is_none());
}

#[tokio::test]
async fn a_drain_reads_the_answer_to_its_end_then_records_and_releases() {
    let recorder = Arc::new(Recorder::default());
    let (drain, drains) = drain(serde_json::json!({}));
    let (chunks, body) = channel_body();
    let (record, mut written) = recording(&recorder);
    drain.body(body, record, held(&recorder));
    chunks.send(data("data: 1\n\n")).await.unwrap();
    chunks.send(data("data: [DONE]\n\n")).await.unwrap();
    assert!(
        written.try_recv().is_err(),
        "not written while the engine answers"
    );
    assert_eq!(recorder.metrics.in_flight_now("d"), 1, "the slot is held");
    drop(chunks); // the engine's answer ends
    assert_eq!(written.await.unwrap(), (Some("drain"), true, true));
    drains.wait().await;
    assert_eq!(recorder.metrics.in_flight_now("d"), 0);
}

#[tokio::test]
async fn a_drain_past_its_byte_bound_is_cut_and_closes_the_engine_s_connection() {
    let recorder = Arc::new(Recorder::default());
    let (drain, drains) = drain(serde_json::json!({"drain_max_bytes": 8}));
    let (chunks, body) = channel_body();
    let (record, written) = recording(&recorder);
    drain.body(body, record, held(&recorder));
    chunks.send(data("data: 1234567890\n\n")).await.unwrap();
    assert_eq!(written.await.unwrap(), (Some("drain_cut"), true, true));
    chunks.closed().await; // the body was dropped: the engine's connection closes
    drains.wait().await;
    assert_eq!(recorder.metrics.in_flight_now("d"), 0);
}

#[tokio::test]
async fn a_drain_past_its_time_bound_is_cut() {
    let recorder = Arc::new(Recorder::default());
    let (drain, _drains) = drain(serde_json::json!({"drain_max_ms": 20}));
    let (chunks, body) = channel_body();
    let (record, written) = recording(&recorder);
    drain.head(
        async move { Ok::<_, std::io::Error>(http::Response::new(body)) },
        record,
        held(&recorder),
    );
    assert_eq!(written.await.unwrap(), (Some("drain_cut"), true, true));
    chunks.closed().await;
}

#[tokio::test]
async fn closed_drains_stop_and_start_no_more() {
    let recorder = Arc::new(Recorder::default());
    let (drain, drains) = drain(serde_json::json!({}));
    let (running, body) = channel_body();
    let (record, written) = recording(&recorder);
    drain.body(body, record, held(&recorder));
    drains.close();
    assert_eq!(written.await.unwrap(), (Some("drain_cut"), true, true));
    running.closed().await;
    // From now on a request handed over is cancelled where it is.
    let (later, body) = channel_body();
    let (record, written) = recording(&recorder);
    drain.body(body, record, held(&recorder));
    assert_eq!(written.await.unwrap(), (Some("cancel"), true, true));
    later.closed().await;
    drains.wait().await;
}

#[tokio::test]
async fn a_stream_whose_client_leaves_is_handed_to_the_drain() {
    let recorder = Arc::new(Recorder::default());
    let (drain, drains) = drain(serde_json::json!({}));
    let (chunks, body) = channel_body();
    let (record, written) = recording(&recorder);
    let mut stream = ObservedStream::new(body, record, backend("d", serde_json::json!({})), false)
        .holding(held(&recorder).unwrap())
        .draining(drain);
    chunks
        .send(data(
            "data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\n",
        ))
        .await
        .unwrap();
    let first = stream.frame().await.unwrap().unwrap();
    assert!(first.data_ref().is_some());
    drop(stream); // the client leaves
    chunks
        .send(data(
            "data: {\"choices\":[{\"delta\":{\"content\":\"b\"}}]}\n\n",
        ))
        .await
        .unwrap();
    assert_eq!(recorder.metrics.in_flight_now("d"), 1, "the slot is held");
    drop(chunks);
    assert_eq!(written.await.unwrap(), (Some("drain"), true, true));
    drains.wait().await;
    assert_eq!(recorder.metrics.in_flight_now("d"), 0);
}
