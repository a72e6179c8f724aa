//! A canary release run by a fleet (issue 49): two Switchyards on one shared ledger, in front
//! of the fake engine. One evaluates (it holds the lease); an operator's action on either —
//! passing the gate, pausing, resuming, aborting — is applied by both, each instance's routing
//! (`/readyz`) showing it within a couple of seconds. With the server stopped, neither
//! evaluates and both route as they did; started again, one evaluates again.

#![allow(clippy::disallowed_methods)] // tokio::spawn: the test's own event listeners

use std::time::{Duration, Instant};

use serde_json::{json, Value};
use switchyard::Running;
use switchyard_observe::ledger::cluster::Cluster;
use switchyard_tests::harness::{start_switchyard_file, wait_ready, TestClient};
use tokio::sync::{broadcast, mpsc};

use crate::durability::support::metric;
use crate::release::{admin, config, drive, engine, start_release};

/// The longest an instance may take to apply what another recorded: it reads the releases
/// each second.
const APPLIED_WITHIN: Duration = Duration::from_secs(5);

/// This instance's route for `smollm2`'s release as its `/readyz` shows it (null without one).
async fn routed(proxy: &Running) -> Value {
    let r = TestClient::new()
        .get(&format!("http://{}/readyz", proxy.addr()))
        .await
        .unwrap();
    r.json()["models"]["smollm2"]["release"].clone()
}

/// Every instance's events in one channel, by kind: each change of its routing (`release`,
/// published once the new routing is live) and of its lease (`evaluator`).
fn changes(fleet: &[Running]) -> mpsc::UnboundedReceiver<&'static str> {
    let (tx, rx) = mpsc::unbounded_channel();
    for proxy in fleet {
        let mut events = proxy.state().events.subscribe();
        let tx = tx.clone();
        tokio::spawn(async move {
            loop {
                let kind = match events.recv().await {
                    Ok(event) => event.kind,
                    Err(broadcast::error::RecvError::Lagged(_)) => "lagged",
                    Err(broadcast::error::RecvError::Closed) => return,
                };
                if tx.send(kind).is_err() {
                    return;
                }
            }
        });
    }
    rx
}

/// Waits for the next change of any instance; false once `deadline` has passed.
async fn next_change(
    changes: &mut mpsc::UnboundedReceiver<&'static str>,
    deadline: Instant,
) -> bool {
    tokio::time::timeout_at(deadline.into(), changes.recv())
        .await
        .is_ok()
}

/// Waits until every instance's route passes `applied`, looking again at each change.
async fn applied_by_all(
    fleet: &[Running],
    changes: &mut mpsc::UnboundedReceiver<&'static str>,
    what: &str,
    applied: impl Fn(&Value) -> bool,
) {
    let deadline = Instant::now() + APPLIED_WITHIN;
    loop {
        let mut routes = Vec::new();
        for proxy in fleet {
            routes.push(routed(proxy).await);
        }
        if routes.iter().all(&applied) {
            return;
        }
        assert!(
            next_change(changes, deadline).await,
            "{what}: not applied by every instance within {APPLIED_WITHIN:?}: {routes:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operators_action_on_either_instance_moves_the_release_on_both() {
    let cluster = Cluster::start();
    let dir = tempfile::tempdir().unwrap();
    let p = engine(dir.path(), |e| e.deterministic()).await;
    let c = engine(dir.path(), |e| e.deterministic().build_info("b5000-cand")).await;
    let mut fleet = Vec::new();
    for instance in ["a", "b"] {
        let text = config(dir.path(), &p.url(), &c.url()).replace(
            &format!("path = \"{}\"", dir.path().join("ledger.db").display()),
            &format!(
                "path = \"{}\"\nurl = \"{}\"\ninstance = \"{instance}\"",
                dir.path().join(format!("{instance}.db")).display(),
                cluster.url()
            ),
        );
        assert!(text.contains(&format!("instance = \"{instance}\"")));
        let path = dir.path().join(format!("{instance}.toml"));
        std::fs::write(&path, text).unwrap();
        let proxy = start_switchyard_file(&path).await.unwrap();
        wait_ready(&proxy, Duration::from_secs(5), |v| {
            ["p", "c"]
                .iter()
                .all(|n| v["backends"][n]["identity"] == "verified")
        })
        .await
        .unwrap();
        fleet.push(proxy);
    }
    let admin_of = |i: usize| format!("http://{}", fleet[i].admin_addr().unwrap());
    let base_of = |i: usize| format!("http://{}", fleet[i].addr());

    // Exactly one evaluates, and each says which.
    let mut changes = changes(&fleet);
    let client = TestClient::new();
    let deadline = Instant::now() + APPLIED_WITHIN;
    let evaluator = loop {
        let mut views = Vec::new();
        for i in 0..fleet.len() {
            views.push(admin_get(&admin_of(i), "/admin/releases").await["evaluator"].clone());
        }
        let holders: Vec<usize> = (0..views.len())
            .filter(|i| views[*i]["this"] == true)
            .collect();
        if holders.len() == 1 && views.iter().all(|v| !v["instance"].is_null()) {
            let holder = holders[0];
            for v in &views {
                assert_eq!(v["shared"], true, "{views:?}");
                assert_eq!(v["instance"], ["a", "b"][holder], "{views:?}");
            }
            break holder;
        }
        assert!(
            next_change(&mut changes, deadline).await,
            "evaluators: {views:?}"
        );
    };
    let other = 1 - evaluator;
    for (i, flag) in [(evaluator, 1), (other, 0)] {
        let seen = metric(&client, &base_of(i), "switchyard_release_evaluator").await;
        assert_eq!(seen, flag);
    }

    // Started on the instance that does not evaluate; driven through the evaluator up to the
    // gate (10 % of sessions on the candidate).
    let id = start_release(&admin_of(other), "climb").await;
    applied_by_all(&fleet, &mut changes, "the release", |r| r["weight"] == 10).await;
    drive(&base_of(evaluator), &admin_of(evaluator), &id, false, |r| {
        r["step_label"] == "gate"
    })
    .await;

    // The gate passed on the instance that does not evaluate: the evaluator takes the step.
    let r = admin(
        &admin_of(other),
        "POST",
        &format!("/admin/releases/{id}/promote"),
        Some(json!({"reason": "looks good"})),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.json());
    applied_by_all(&fleet, &mut changes, "the gate passed", |r| {
        r["weight"] == 50
    })
    .await;

    // The shared ledger stopped: no instance evaluates, each routes as it did, every request
    // is answered; started again, one evaluates again.
    let evaluators = async || {
        let mut sum = 0;
        for i in 0..fleet.len() {
            sum += metric(&client, &base_of(i), "switchyard_release_evaluator").await;
        }
        sum
    };
    let answered = async |i: usize| {
        let r = TestClient::new()
            .post_json(
                &format!("{}/v1/chat/completions", base_of(i)),
                &json!({"model": "smollm2", "messages": [{"role": "user", "content": "hi"}]}),
            )
            .await
            .unwrap();
        assert_eq!(r.status, 200);
    };
    tokio::task::block_in_place(|| cluster.stop());
    let deadline = Instant::now() + Duration::from_secs(15);
    while evaluators().await != 0 {
        assert!(
            next_change(&mut changes, deadline).await,
            "still evaluating with the server stopped"
        );
    }
    for i in 0..fleet.len() {
        answered(i).await;
    }
    applied_by_all(&fleet, &mut changes, "the outage", |r| {
        r["weight"] == 50 && r["state"] == "running"
    })
    .await;
    tokio::task::block_in_place(|| cluster.resume());
    let deadline = Instant::now() + Duration::from_secs(15);
    while evaluators().await != 1 {
        assert!(
            next_change(&mut changes, deadline).await,
            "no evaluator once the server is back"
        );
    }

    // Paused on one, resumed on the other, aborted on the first.
    for (on, action, applied) in [
        (other, "pause", "paused"),
        (evaluator, "resume", "running"),
        (other, "abort", "aborted"),
    ] {
        let r = admin(
            &admin_of(on),
            "POST",
            &format!("/admin/releases/{id}/{action}"),
            Some(json!({"reason": format!("{action} from instance {on}")})),
        )
        .await;
        assert_eq!(r.status, 200, "{action}: {}", r.json());
        if applied == "aborted" {
            // An ended release routes nothing: every session on the primary.
            applied_by_all(&fleet, &mut changes, action, Value::is_null).await;
        } else {
            applied_by_all(&fleet, &mut changes, action, |r| r["state"] == applied).await;
        }
    }
    // One history, seen alike from both, naming the operator's actions and the evaluator's steps.
    let history = |i: usize| {
        let admin = admin_of(i);
        let id = id.clone();
        async move {
            admin_get(&admin, &format!("/admin/releases/{id}")).await["events"]
                .as_array()
                .unwrap()
                .iter()
                .map(|e| {
                    (
                        e["to_state"].clone(),
                        e["to_step"].clone(),
                        e["actor"].clone(),
                    )
                })
                .collect::<Vec<_>>()
        }
    };
    let (seen_a, seen_b) = (history(0).await, history(1).await);
    assert_eq!(seen_a, seen_b);
    let states: Vec<&str> = seen_a.iter().map(|(s, _, _)| s.as_str().unwrap()).collect();
    assert_eq!(
        states,
        ["running", "running", "running", "paused", "running", "aborted"],
        "{seen_a:?}"
    );
}

async fn admin_get(admin_url: &str, path: &str) -> Value {
    admin(admin_url, "GET", path, None).await.json()
}
