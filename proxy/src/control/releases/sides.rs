//! A release's two sides as the evaluator sees them. Each is a backend or a pool of backends
//! (`[pools]`); a pool stands for its members, which all serve one identity: the release pins
//! that identity, counts every member's answers and copies as the side's, and finds the side
//! changed or down only as a whole (a member that drifts alone is set apart by its pool and
//! serves nothing; one that is down leaves the others to serve).

use switchyard_engine::Verification;

use super::ReleaseError;
use crate::route::Snapshot;

/// The backends side `name` stands for: a pool's members, else the backend itself.
pub(super) fn members(snapshot: &Snapshot, name: &str) -> Vec<String> {
    match snapshot.pools.get(name) {
        Some(pool) => pool.members.iter().map(|m| m.to_string()).collect(),
        None => vec![name.to_owned()],
    }
}

/// Side `name`'s identity as a release pins it: the engine and artifact stamps of the backend,
/// or those every serving member of the pool shares; each verified.
pub(super) fn pinned(snapshot: &Snapshot, name: &str) -> Result<(String, String), ReleaseError> {
    let Some(pool) = snapshot.pools.get(name) else {
        return pinned_backend(snapshot, name);
    };
    let mut pinned: Option<(String, String, &str)> = None;
    for member in &pool.members {
        let down = snapshot
            .backends
            .get(member)
            .is_some_and(|b| b.state().report.is_some() && !b.state().health().is_ready());
        if down {
            continue;
        }
        let (engine, artifact) = pinned_backend(snapshot, member)?;
        match &pinned {
            None => pinned = Some((engine, artifact, member)),
            Some((e, a, first)) if *e != engine || *a != artifact => {
                return Err(ReleaseError::Refused(format!(
                    "the members of pool {name} differ ({first} is engine {e}, artifact {a}; {member} is engine {engine}, artifact {artifact}): a release pins one identity per side"
                )));
            }
            Some(_) => {}
        }
    }
    pinned
        .map(|(engine, artifact, _)| (engine, artifact))
        .ok_or_else(|| {
            ReleaseError::Refused(format!(
                "no member of pool {name} serves now: a release pins the identity its members serve"
            ))
        })
}

/// A backend's identity as a release pins it: its engine and artifact stamps, when verified.
fn pinned_backend(snapshot: &Snapshot, backend: &str) -> Result<(String, String), ReleaseError> {
    let b = snapshot
        .backends
        .get(backend)
        .ok_or_else(|| ReleaseError::Refused(format!("no backend or pool named {backend}")))?;
    let headers = b.identity_headers();
    match &headers.verification {
        // A build still being found out (the digest of the binary the configuration names):
        // pinned now, it would differ from the next answer's, and supersede the release.
        Verification::Verified
            if b.config.binary.is_some()
                && headers.engine.to_str().is_ok_and(|e| e.ends_with("/unknown")) =>
        {
            Err(ReleaseError::Refused(format!(
                "{backend}'s engine build is not known yet (the digest of its `binary` is being taken): try again in a moment"
            )))
        }
        Verification::Verified => Ok((
            headers.engine.to_str().unwrap_or("").to_owned(),
            headers.artifact.to_str().unwrap_or("").to_owned(),
        )),
        Verification::Unverified(why) | Verification::Unknown(why) => Err(ReleaseError::Refused(
            format!("{backend}'s identity is not verified ({why}): a release pins both engines' identities, so both must be verified"),
        )),
    }
}

/// Side `name`'s identity now when it is no longer `(engine, artifact)`, the one the release
/// pinned; `Err` when it is not known yet (not probed or hashed since a start): no verdict can
/// be given then. A backend its probes found not serving (down, or loading) shows no identity
/// to speak of, hence no change of one; whether it is down is the evaluation's other question.
/// A pool's identity is the one most of its known members have, which is the one it serves.
pub(super) fn changed(
    snapshot: &Snapshot,
    role: &str,
    name: &str,
    (engine, artifact): (&str, &str),
) -> Result<Option<String>, String> {
    if let Some(pool) = snapshot.pools.get(name) {
        let Some((now_engine, now_artifact)) = pool.identity(&snapshot.backends) else {
            let unknown = pool.members.iter().find(|m| {
                snapshot.backends.get(*m).is_some_and(|b| {
                    serving(b)
                        && matches!(b.identity_headers().verification, Verification::Unknown(_))
                })
            });
            return match unknown {
                Some(member) => Err(format!(
                    "the {role} pool {name}'s identity is not known yet ({member}'s is being found out)"
                )),
                None => Ok(None),
            };
        };
        return Ok((*now_engine != *engine || *now_artifact != *artifact).then(|| {
            format!(
                "the {role} pool {name} now serves engine {now_engine}, artifact {now_artifact}; the release pinned engine {engine}, artifact {artifact}"
            )
        }));
    }
    let Some(backend) = snapshot.backends.get(name) else {
        return Ok(Some(format!(
            "the {role} backend {name} is no longer configured"
        )));
    };
    if !serving(backend) {
        return Ok(None);
    }
    let headers = backend.identity_headers();
    if let Verification::Unknown(why) = &headers.verification {
        return Err(format!(
            "the {role} {name}'s identity is not known yet ({why})"
        ));
    }
    let (now_engine, now_artifact) = (
        headers.engine.to_str().unwrap_or(""),
        headers.artifact.to_str().unwrap_or(""),
    );
    Ok((now_engine != engine || now_artifact != artifact).then(|| {
        format!(
            "the {role} {name} is now engine {now_engine}, artifact {now_artifact}; the release pinned engine {engine}, artifact {artifact}"
        )
    }))
}

/// Whether a backend may be serving: probed ready, or not probed yet.
fn serving(backend: &switchyard_engine::Backend) -> bool {
    let probed = backend.state();
    probed.report.is_none() || probed.health().is_ready()
}

/// Why side `name` is down per its probes: the backend's reason, or, for a pool, every
/// member's when all are down (a pool with one member up still serves).
pub(super) fn down(snapshot: &Snapshot, name: &str) -> Option<String> {
    let why = |backend: &str| {
        snapshot
            .backends
            .get(backend)
            .and_then(|b| match b.state().health() {
                switchyard_adapters::Health::Down(why) => Some(why),
                _ => None,
            })
    };
    let Some(pool) = snapshot.pools.get(name) else {
        return why(name);
    };
    let reasons = pool
        .members
        .iter()
        .map(|m| why(m).map(|why| format!("{m}: {why}")))
        .collect::<Option<Vec<String>>>()?;
    Some(format!(
        "every member of pool {name} is down ({})",
        reasons.join("; ")
    ))
}

/// What the detectors find wrong with side `name` now: its backend's degradations, or those of
/// any member of its pool, each named; none when nothing is found.
pub(super) fn degraded(snapshot: &Snapshot, name: &str) -> Option<String> {
    let found: Vec<String> = members(snapshot, name)
        .iter()
        .filter_map(|m| snapshot.backends.get(m.as_str()))
        .flat_map(|b| {
            b.degraded()
                .iter()
                .map(|d| format!("{} is degraded ({})", b.name, d.describe()))
                .collect::<Vec<_>>()
        })
        .collect();
    (!found.is_empty()).then(|| found.join("; "))
}
