//! The admin API's reads of the ledger, for the dashboard (`/ui`) and for scripts:
//!
//! - `GET /admin/overview?window=`: each public model with its backends by role and their
//!   states, its release, and the window's requests, errors, median total and time to first
//!   token (the ledger's; without a ledger, no figures);
//! - `GET /admin/requests?limit=&model=&backend=&variant=&status=&before=`: the latest requests,
//!   newest first, as their ledger rows (the event stream's `request` events have the same shape);
//! - `GET /admin/stats/phases?window=&model=&backend=`: where the time goes, per model, backend,
//!   variant and warmth;
//! - `GET /admin/comparisons?window=&model=&candidate=`: the comparator's groups of shadow
//!   pairs with their verdicts, and a mismatched group's two outputs;
//! - `GET /admin/identities?backend=&window=&limit=`: each backend's health and identity history;
//! - `GET /admin/engine-actions?backend=&window=&limit=`: operators' loads, unloads and restarts.
//!
//! Each read opens the ledger read-only on a blocking thread (WAL lets it run beside the
//! writer), so the runtime never waits on the disk, and each is bounded by a window or a limit.
//!
//! With a shared ledger (`[ledger] url`), the overview's figures, the requests, the phases and
//! the comparisons are the whole fleet's, read from PostgreSQL (each request naming its
//! `instance`); the identities and engine actions stay this instance's own (what its probes
//! saw, what was done to the engines through it).

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Response, StatusCode};
use rusqlite::Connection;
use serde_json::{json, Value};
use switchyard_observe::ledger::{
    engine_actions, identity_history, latest_requests, model_stats, now_ms, open_read_only,
    parse_window, phase_stats, read_comparisons, window_start, PgError, PhaseFilter, RequestFilter,
    StatusFilter,
};
use switchyard_policy::compare::{compare, GroupKey, Pair, Status, Verdict};

use super::error;
use crate::control::AppState;
use crate::http::{json_response, ProxyBody};

/// The window a read covers when the call names none.
const DEFAULT_WINDOW: Duration = Duration::from_secs(3600);

/// Answers a dashboard read; None when `path` is not one of them.
pub(super) async fn route(
    state: &Arc<AppState>,
    path: &str,
    query: Option<&str>,
) -> Option<Response<ProxyBody>> {
    let params = Params::parse(query.unwrap_or(""));
    let answer = match path {
        "/admin/overview" => overview(state, &params).await,
        "/admin/requests" => requests(state, &params).await,
        "/admin/stats/phases" => phases(state, &params).await,
        "/admin/comparisons" => comparisons(state, &params).await,
        "/admin/identities" => identities(state, &params, identity_history).await,
        "/admin/engine-actions" => identities(state, &params, engine_actions).await,
        _ => return None,
    };
    Some(answer.unwrap_or_else(|refused| refused))
}

type Answer = Result<Response<ProxyBody>, Response<ProxyBody>>;

async fn overview(state: &Arc<AppState>, params: &Params) -> Answer {
    params.only(&["window"]).map_err(bad)?;
    let from_ms = params.window().map_err(bad)?;
    // The states come from memory and are shown whatever the ledger does; without a readable
    // ledger the figures are null (`read` has logged why).
    let figures = if let Some(fleet) = &state.fleet {
        shared(fleet.model_stats(from_ms)).await.ok()
    } else if state.config().ledger.is_some() {
        read(state, move |conn| model_stats(conn, from_ms))
            .await
            .ok()
    } else {
        None
    };
    let snapshot = state.live.load();
    let mut models = Vec::new();
    for name in snapshot.config.models.keys() {
        let Some(route) = snapshot.routes.resolve(name) else {
            continue;
        };
        let release = snapshot.releases.get(name.as_str());
        let roles = snapshot.roles(name);
        let backends: Vec<Value> = roles
            .map(|(role, name)| {
                let backend = snapshot.backends.get(name);
                let (engine_state, reason) = backend.map_or((Value::Null, None), |b| {
                    let (s, why) = b.engine_state();
                    (json!(s), why)
                });
                let headers = backend.map(|b| b.identity_headers());
                let text = |f: fn(&switchyard_engine::IdentityHeaders) -> &http::HeaderValue| {
                    headers
                        .as_ref()
                        .and_then(|h| f(h).to_str().ok())
                        .map(str::to_owned)
                };
                json!({
                    "backend": &**name,
                    "role": role,
                    "state": engine_state,
                    "reason": reason,
                    "managed": backend.is_some_and(|b| b.managed.is_some()),
                    "engine": text(|h| &h.engine),
                    "artifact": text(|h| &h.artifact),
                    "weight": match role {
                        "candidate" => release.map(|r| Value::from(r.weight)),
                        "primary" => Some(Value::from(100 - release.map_or(0, |r| r.weight))),
                        _ => None,
                    },
                    "share": (role == "shadow").then(|| route.shadow.as_ref().map(|s| s.sample)),
                })
            })
            .collect();
        let stats = figures
            .as_ref()
            .and_then(|rows| rows.iter().find(|r| r["model"] == **name).cloned())
            .unwrap_or_else(|| json!({"requests": 0, "errors": 0}));
        models.push(json!({
            "model": name,
            "aliases": snapshot.config.models[name].aliases,
            "patterns": snapshot.config.models[name].patterns,
            "backends": backends,
            "release": release.map(|r| json!({
                "id": &*r.id,
                "candidate": &*r.candidate,
                "weight": r.weight,
                "state": r.state,
                "waiting_for": r.waiting_for,
            })),
            "stats": if figures.is_some() { stats } else { Value::Null },
        }));
    }
    let unrouted = figures
        .as_ref()
        .and_then(|rows| rows.iter().find(|r| r["model"] == "-").cloned());
    Ok(ok(json!({
        "window": {"from_ms": from_ms, "to_ms": now_ms()},
        "config_digest": &*snapshot.digest,
        "models": models,
        "unrouted": unrouted,
        "figures_from": if state.fleet.is_some() { "fleet" } else { "instance" },
        "swap_groups": state.engines.swap_groups(),
    })))
}

async fn requests(state: &Arc<AppState>, params: &Params) -> Answer {
    params
        .only(&["limit", "model", "backend", "variant", "status", "before"])
        .map_err(bad)?;
    let status = match params.get("status") {
        None => None,
        Some(text) => Some(StatusFilter::parse(text).ok_or_else(|| {
            bad(format!(
                "status `{text}`: expected ok, error or a status code"
            ))
        })?),
    };
    let filter = RequestFilter {
        limit: params.number("limit", 50, 1000).map_err(bad)?,
        model: params.text("model"),
        backend: params.text("backend"),
        variant: params.text("variant"),
        status,
        before_id: match params.get("before") {
            None => None,
            Some(_) => Some(i64::from(
                params.number("before", 0, u32::MAX).map_err(bad)?,
            )),
        },
    };
    let rows = match &state.fleet {
        Some(fleet) => shared(fleet.latest_requests(&filter)).await?,
        None => read(state, move |conn| latest_requests(conn, &filter)).await?,
    };
    Ok(ok(json!({"requests": rows})))
}

async fn phases(state: &Arc<AppState>, params: &Params) -> Answer {
    params.only(&["window", "model", "backend"]).map_err(bad)?;
    let from_ms = params.window().map_err(bad)?;
    let filter = PhaseFilter {
        from_ms,
        model: params.text("model"),
        backend: params.text("backend"),
    };
    let groups = match &state.fleet {
        Some(fleet) => shared(fleet.phase_stats(&filter)).await?,
        None => read(state, move |conn| phase_stats(conn, &filter)).await?,
    };
    Ok(ok(json!({
        "window": {"from_ms": from_ms, "to_ms": now_ms()},
        "phases": switchyard_observe::ledger::BAR_PHASES,
        "groups": groups,
    })))
}

async fn comparisons(state: &Arc<AppState>, params: &Params) -> Answer {
    params
        .only(&["window", "model", "candidate"])
        .map_err(bad)?;
    let from_ms = params.window().map_err(bad)?;
    let (model, candidate) = (params.text("model"), params.text("candidate"));
    let mut pairs = match &state.fleet {
        Some(fleet) => shared(fleet.comparisons(from_ms)).await?,
        None => read(state, move |conn| read_comparisons(conn, Some(from_ms))).await?,
    };
    pairs.retain(|p| {
        model.as_ref().is_none_or(|m| &p.model == m)
            && candidate
                .as_ref()
                .is_none_or(|c| p.candidate.as_ref().is_some_and(|side| &side.backend == c))
    });
    // Cold and warm pairs are judged in groups of their own; both are shown.
    let judged = compare(&pairs, true);
    let groups: Vec<Value> = judged
        .groups
        .iter()
        .map(|g| {
            let k = &g.key;
            let mut group = json!({
                "model": k.model,
                "primary": {"backend": k.primary_backend, "engine": k.primary_engine, "artifact": k.primary_artifact},
                "candidate": {"backend": k.candidate_backend, "engine": k.candidate_engine, "artifact": k.candidate_artifact},
                "workload": k.workload,
                "sampling": k.sampling,
                "warm": k.warm,
                "mode": k.mode,
                "streamed": k.streamed,
                "counts": g.counts,
                "status": g.status,
                "detail": g.detail,
                "mismatch": mismatch(&pairs, k),
            });
            // Speed is concluded only where every judged pair matched: never beside a mismatch.
            if g.status == Status::Ratios {
                group["ratios"] = serde_json::to_value(&g.ratios).unwrap_or(Value::Null);
            }
            group
        })
        .collect();
    Ok(ok(json!({
        "window": {"from_ms": from_ms, "to_ms": now_ms()},
        "min_repetitions": judged.min_repetitions,
        "groups": groups,
        "divergences": judged.divergences,
    })))
}

/// The newest mismatched pair of the group, its two outputs side by side; null when none.
fn mismatch(pairs: &[Pair], key: &GroupKey) -> Value {
    pairs
        .iter()
        .rev()
        .find(|p| p.verdict == Verdict::Mismatch && &GroupKey::of(p) == key)
        .map_or(Value::Null, |p| {
            let side = |s: Option<&switchyard_policy::compare::Side>| {
                json!({
                    "request_id": s.and_then(|s| s.request_id.clone()),
                    "output": s.and_then(|s| s.output.clone()),
                    "text": s.and_then(|s| s.text.clone()),
                })
            };
            json!({
                "reason": p.reason,
                "primary": side(Some(&p.primary)),
                "candidate": side(p.candidate.as_ref()),
            })
        })
}

/// Per backend (or the one `backend` names), rows of the window from `rows`: its health and
/// identity history, or the operators' actions on it.
async fn identities(
    state: &Arc<AppState>,
    params: &Params,
    rows: fn(&Connection, &str, i64, u32) -> rusqlite::Result<Vec<Value>>,
) -> Answer {
    params.only(&["backend", "window", "limit"]).map_err(bad)?;
    let from_ms = params.window().map_err(bad)?;
    let limit = params.number("limit", 20, 500).map_err(bad)?;
    let backends: Vec<String> = match params.text("backend") {
        Some(name) => vec![name],
        None => state
            .live
            .load()
            .backends
            .keys()
            .map(|k| k.to_string())
            .collect(),
    };
    let history = read(state, move |conn| {
        let mut all = serde_json::Map::new();
        for backend in backends {
            let found = rows(conn, &backend, from_ms, limit)?;
            all.insert(backend, Value::from(found));
        }
        Ok(all)
    })
    .await?;
    Ok(ok(
        json!({"window": {"from_ms": from_ms, "to_ms": now_ms()}, "backends": history}),
    ))
}

/// Runs `f` on a read-only connection to the ledger, on a blocking thread.
async fn read<T: Send + 'static>(
    state: &Arc<AppState>,
    f: impl FnOnce(&Connection) -> rusqlite::Result<T> + Send + 'static,
) -> Result<T, Response<ProxyBody>> {
    let Some(path) = state.config().ledger.as_ref().map(|l| l.path.clone()) else {
        return Err(error(
            StatusCode::CONFLICT,
            "this needs a ledger: configure [ledger]",
            "no_ledger",
        ));
    };
    let read = tokio::task::spawn_blocking(move || {
        let conn = open_read_only(&path).map_err(|e| e.to_string())?;
        f(&conn).map_err(|e| format!("ledger {}: {e}", path.display()))
    })
    .await;
    match read {
        Ok(Ok(value)) => Ok(value),
        Ok(Err(e)) => {
            tracing::warn!(error = %e, "an admin read of the ledger failed");
            Err(error(
                StatusCode::SERVICE_UNAVAILABLE,
                "the ledger could not be read; see Switchyard's log",
                "ledger_unavailable",
            ))
        }
        Err(e) => Err(error(
            StatusCode::INTERNAL_SERVER_ERROR,
            &e.to_string(),
            "internal_error",
        )),
    }
}

/// Awaits a read of the shared ledger; one that fails answers 503 with the server's words.
async fn shared<T>(
    read: impl std::future::Future<Output = Result<T, PgError>>,
) -> Result<T, Response<ProxyBody>> {
    read.await.map_err(|e| {
        tracing::warn!(error = %e, "an admin read of the shared ledger failed");
        error(
            StatusCode::SERVICE_UNAVAILABLE,
            &format!("the shared ledger could not be read: {e}"),
            "shared_ledger_unavailable",
        )
    })
}

fn ok(value: Value) -> Response<ProxyBody> {
    json_response(StatusCode::OK, Bytes::from(value.to_string()))
}

fn bad(message: String) -> Response<ProxyBody> {
    error(StatusCode::BAD_REQUEST, &message, "invalid_query")
}

/// A call's query parameters, percent-decoded.
struct Params(Vec<(String, String)>);

impl Params {
    fn parse(query: &str) -> Self {
        Self(
            query
                .split('&')
                .filter(|p| !p.is_empty())
                .map(|pair| {
                    let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
                    (decode(k), decode(v))
                })
                .collect(),
        )
    }

    fn get(&self, name: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    /// A text parameter; an empty one is no filter.
    fn text(&self, name: &str) -> Option<String> {
        self.get(name).filter(|v| !v.is_empty()).map(str::to_owned)
    }

    /// Refuses a parameter not in `known`: a misspelt filter must not silently show everything.
    fn only(&self, known: &[&str]) -> Result<(), String> {
        match self.0.iter().find(|(k, _)| !known.contains(&k.as_str())) {
            Some((k, _)) => Err(format!(
                "unknown parameter `{k}`; this endpoint takes {}",
                known.join(", ")
            )),
            None => Ok(()),
        }
    }

    fn number(&self, name: &str, default: u32, max: u32) -> Result<u32, String> {
        match self.get(name) {
            None => Ok(default),
            Some(text) => match text.parse::<u32>() {
                Ok(n) if (1..=max).contains(&n) => Ok(n),
                _ => Err(format!(
                    "{name} `{text}`: expected a whole number from 1 to {max}"
                )),
            },
        }
    }

    /// The first millisecond of the `window` parameter's window (default an hour).
    fn window(&self) -> Result<i64, String> {
        match self.get("window") {
            None => Ok(window_start(DEFAULT_WINDOW)),
            Some(text) => parse_window(text)
                .map(window_start)
                .map_err(|e| format!("window {e}")),
        }
    }
}

/// Percent-decodes a query component (`+` is a space); invalid escapes stay as they are.
fn decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < bytes.len() => {
                match u8::from_str_radix(text.get(i + 1..i + 3).unwrap_or(""), 16) {
                    Ok(byte) => {
                        out.push(byte);
                        i += 2;
                    }
                    Err(_) => out.push(b'%'),
                }
            }
            other => out.push(other),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::{decode, Params};

    #[test]
    fn query_components_are_decoded() {
        assert_eq!(decode("smollm2%2Dmlx"), "smollm2-mlx");
        assert_eq!(decode("a+b%20c"), "a b c");
        assert_eq!(decode("100%"), "100%");
        assert_eq!(decode("%zz"), "%zz");
        let params = Params::parse("model=smollm2&limit=5&backend=");
        assert_eq!(params.get("limit"), Some("5"));
        assert_eq!(params.text("backend"), None);
        assert!(params.only(&["model", "limit", "backend"]).is_ok());
        assert!(params.only(&["model"]).is_err());
        assert!(params.number("limit", 50, 4).is_err());
    }
}
