use futures_util::FutureExt as _;

use super::*;

fn record(recorder: &Arc<Recorder>, id: &str) -> Recording {
    let mut r = Recording::new(
        recorder.clone(),
        RequestRecord::new(
            id.to_owned(),
            http::Method::POST,
            "/v1/chat/completions".to_owned(),
            std::time::Instant::now(),
        ),
    );
    r.status = 200;
    r
}

fn written(recorder: &Recorder) -> u64 {
    recorder.stats.requests.load(Ordering::Relaxed)
}

#[test]
fn server_timing_follows_the_phases_it_was_made_of() {
    let recorder = Arc::new(Recorder::default());
    let mut r = record(&recorder, "a");
    r.phases.ttfb = Some(1.5);
    let first = r.server_timing();
    assert_eq!(first, "ttfb;dur=1.500");
    assert_eq!(r.server_timing(), first);
    r.phases.total = Some(2.0);
    assert_eq!(r.server_timing(), "ttfb;dur=1.500, total;dur=2.000");
}

#[tokio::test(flavor = "current_thread")]
async fn records_of_one_turn_are_written_together_and_later_ones_apart() {
    let recorder = Arc::new(Recorder::default());
    record(&recorder, "a").finish_after_response();
    record(&recorder, "b").finish_after_response();
    assert_eq!(
        written(&recorder),
        0,
        "written before the responses went out"
    );
    assert_eq!(
        recorder.queued().records.len(),
        2,
        "the second joins the first's task"
    );
    tokio::task::yield_now().await;
    assert_eq!(written(&recorder), 2);
    assert!(!recorder.queued().draining);
    // The next one starts a task of its own.
    record(&recorder, "c").finish_after_response();
    assert_eq!(written(&recorder), 2);
    recorder.settled().await;
    assert_eq!(written(&recorder), 3);
    assert!(recorder.queued().records.is_empty());
}

#[tokio::test(flavor = "current_thread")]
async fn a_deferred_record_is_written_after_the_task_yields_and_settled_waits_for_it() {
    let recorder = Arc::new(Recorder::default());
    record(&recorder, "a").finish_after_response();
    assert_eq!(
        written(&recorder),
        0,
        "written before the response went out"
    );
    recorder.settled().await;
    assert_eq!(written(&recorder), 1);
    assert!(recorder.metrics.render().contains("status_class=\"2xx\""));
}

#[tokio::test(flavor = "current_thread")]
async fn while_a_reader_waits_records_are_written_before_their_responses() {
    let recorder = Arc::new(Recorder::default());
    record(&recorder, "a").finish_after_response();
    // A scrape arrives: it waits for "a", and holds the gate against new permits.
    let settle = |recorder: &Arc<Recorder>| {
        let recorder = recorder.clone();
        let mut settling = Box::pin(async move { recorder.settled().await });
        assert!((&mut settling).now_or_never().is_none(), "the scrape waits");
        settling
    };
    let settling = settle(&recorder);
    // "b" joins the batch on its way, which the scrape waits for.
    record(&recorder, "b").finish_after_response();
    assert_eq!(written(&recorder), 0);
    settling.await;
    assert_eq!(written(&recorder), 2);

    // Once the batch is taken, a record that comes while a scrape waits is written at once.
    record(&recorder, "c").finish_after_response();
    let settling = settle(&recorder);
    tokio::task::yield_now().await;
    assert_eq!(written(&recorder), 3, "c's batch was written");
    record(&recorder, "d").finish_after_response();
    assert_eq!(written(&recorder), 4, "d was written at once");
    settling.await;
    assert_eq!(written(&recorder), 4);
}

#[test]
fn the_metrics_observe_each_record_once_when_it_is_written() {
    let recorder = Arc::new(Recorder::default());
    let routed = |id| {
        let mut r = record(&recorder, id);
        r.model = Some(Arc::from("smollm2"));
        r.backend = Some(Arc::from("llama"));
        r.variant = "primary";
        r
    };
    routed("a").finish();
    // Dropped unfinished: the client left before any status.
    let mut left = routed("b");
    left.status = 0;
    drop(left);

    let text = recorder.render_metrics(None);
    let series = "model=\"smollm2\",backend=\"llama\",variant=\"primary\"";
    for line in [
        format!("switchyard_requests_total{{{series},status_class=\"2xx\"}} 1\n"),
        format!("switchyard_requests_total{{{series},status_class=\"none\"}} 1\n"),
        "switchyard_client_disconnects_total{backend=\"llama\"} 1\n".to_owned(),
        // Both closed when written: `total` measured.
        format!("gen_ai_server_request_duration_seconds_count{{{series}}} 2\n"),
    ] {
        assert!(text.contains(&line), "{line} not in:\n{text}");
    }
    assert_eq!(written(&recorder), 2);
}
