//! A release as the admin API and the CLI show it.

use serde_json::{json, Value};
use switchyard_observe::ledger::Release;
use switchyard_policy::release::{Plan, Step};

/// A release as the admin API shows it: its row, its plan's current step and weight.
pub fn describe(release: &Release) -> Value {
    let plan = serde_json::from_str::<Plan>(&release.plan_json).ok();
    let index = usize::try_from(release.step).unwrap_or(usize::MAX);
    let step = plan.as_ref().and_then(|p| p.steps.get(index));
    let weight = match (release.state.as_str(), &plan) {
        ("completed", _) => 100,
        ("aborted" | "superseded" | "undone", _) => 0,
        (_, Some(plan)) => plan.weight_at(index),
        _ => 0,
    };
    json!({
        "id": release.id,
        "model": release.model,
        "primary": release.primary_backend,
        "candidate": release.candidate_backend,
        "plan": release.plan_name,
        "state": release.state,
        "step": release.step,
        "step_label": step.map(Step::label),
        "steps": plan.as_ref().map(|p| p.steps.iter().map(Step::label).collect::<Vec<_>>()),
        "weight": weight,
        "waiting_for": release.reason,
        "override_correctness": release.override_correctness,
        "tolerance": plan.as_ref().and_then(|p| p.tolerance),
        "promote_requested": release.promote_requested,
        "pinned": {
            "primary": {"engine": release.primary_engine, "artifact": release.primary_artifact},
            "candidate": {"engine": release.candidate_engine, "artifact": release.candidate_artifact},
        },
        "created_ms": release.created_ms,
        "step_started_ms": release.step_started_ms,
        "updated_ms": release.updated_ms,
    })
}
