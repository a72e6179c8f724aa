//! `switchyard init`: a commented starter configuration for the engines answering on this
//! machine, each identified by what it answers (its adapter's probes, and the marks Ollama and
//! LM Studio leave), with its model file or folder as the artifact where the engine names one.

use std::fmt::Write as _;
use std::io::Write as _;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use bytes::Bytes;
use clap::Args;
use http_body_util::{BodyExt as _, Empty};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use switchyard_adapters::ProbeResult;
use switchyard_policy::EngineKind;

use super::EX_USAGE;

/// The loopback ports engines answer on by default: llama-server and mlx_lm.server (8080, and
/// the next ones when several run), vLLM and others (8000), LM Studio (1234), Ollama (11434).
const COMMON_PORTS: &[u16] = &[8080, 8081, 8082, 8083, 8000, 1234, 11434];

/// How long an engine gets to answer each of init's questions.
const ASK_TIMEOUT: Duration = Duration::from_millis(1500);

#[derive(Debug, Args)]
pub struct InitArgs {
    /// An engine to include, as `http://host:port` (repeatable); the common loopback ports are
    /// looked at too unless `--no-scan`.
    #[arg(long = "engine", value_name = "URL")]
    engines: Vec<String>,
    /// Look only at the `--engine` URLs.
    #[arg(long)]
    no_scan: bool,
    /// Where to write the configuration; `-` prints it. Default: where `serve` looks first
    /// (`~/.config/switchyard/switchyard.toml`).
    #[arg(long, short)]
    output: Option<PathBuf>,
    /// Replace an existing file.
    #[arg(long)]
    force: bool,
    /// A coding agent to set up (repeatable): a model whose engine serves its API takes every
    /// model name it sends (`patterns = ["*"]`), and its settings are printed.
    #[arg(long, value_enum, value_name = "AGENT")]
    agent: Vec<super::agents::Agent>,
}

/// An engine that answered, as it will be configured.
#[derive(Debug, Clone, PartialEq)]
struct Found {
    url: String,
    engine: EngineKind,
    /// What it is, for the comment above it (`llama-server b6100`, `Ollama 0.5.1`).
    what: String,
    /// The model id it serves (the public model's name is made from it).
    model: String,
    /// The model file or folder, when the engine names one that is on this machine.
    artifact: Option<String>,
    /// The `model` to send, for engines that serve several (Ollama, LM Studio).
    upstream_model: Option<String>,
}

pub(super) async fn run(args: InitArgs) -> anyhow::Result<i32> {
    let mut urls: Vec<String> = args
        .engines
        .iter()
        .map(|u| u.trim_end_matches('/').to_owned())
        .collect();
    if !args.no_scan {
        urls.extend(COMMON_PORTS.iter().map(|p| format!("http://127.0.0.1:{p}")));
    }
    urls.dedup();
    let asked = futures_util::future::join_all(urls.iter().map(|u| identify(u))).await;
    let mut found = Vec::new();
    for (url, result) in urls.iter().zip(asked) {
        match result {
            Ok(mut engines) => found.append(&mut engines),
            Err(why) if args.engines.contains(url) => {
                super::admin::eprintln(&format!("{url}: {why}"))
            }
            Err(_) => {}
        }
    }
    if found.is_empty() {
        super::admin::eprintln(
            "no engine answered (looked at the --engine URLs and the common loopback ports); start one, or name it with --engine http://127.0.0.1:PORT",
        );
        return Ok(1);
    }
    let taken: Vec<u16> = found.iter().filter_map(|f| port_of(&f.url)).collect();
    let listen = free_listen(&taken);
    let catch_all = if args.agent.is_empty() {
        None
    } else {
        let engines: Vec<EngineKind> = found.iter().map(|f| f.engine).collect();
        match super::agents::catch_all(&engines, &args.agent) {
            Ok(i) => Some(i),
            Err(why) => {
                super::admin::eprintln(&why);
                return Ok(1);
            }
        }
    };
    let (text, names) = render(&found, listen, catch_all);
    let told = catch_all.map(|i| super::agents::instructions(&args.agent, listen, &names[i]));
    let output = match args.output {
        Some(p) if p.as_os_str() == "-" => {
            std::io::stdout().lock().write_all(text.as_bytes())?;
            if let Some(told) = &told {
                // The configuration is on stdout: the agents' settings go beside it.
                super::admin::eprintln(told);
            }
            return Ok(0);
        }
        Some(p) => p,
        None => match super::discover::default_place() {
            Some(p) => p,
            None => {
                super::admin::eprintln("HOME is not set: give --output");
                return Ok(EX_USAGE);
            }
        },
    };
    if output.exists() && !args.force {
        super::admin::eprintln(&format!(
            "{} exists; --force replaces it, --output - prints the configuration instead",
            output.display()
        ));
        return Ok(EX_USAGE);
    }
    if let Some(dir) = output.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::write(&output, &text)?;
    let mut out = std::io::stdout().lock();
    for f in &found {
        writeln!(out, "found {} at {} serving {}", f.what, f.url, f.model)?;
    }
    writeln!(
        out,
        "wrote {}; check it with `switchyard check --config {0}`",
        output.display()
    )?;
    if let Some(told) = &told {
        write!(out, "\n{told}")?;
    }
    Ok(0)
}

/// A GET with a short timeout: the status, the `Server` header and the body.
async fn get(url: &str) -> Result<(u16, String, Bytes), String> {
    // A connection per GET, never kept for another: `init` asks each engine a few questions,
    // and a connection kept between them could be closed by the engine as the next goes out.
    let client = Client::builder(TokioExecutor::new())
        .pool_max_idle_per_host(0)
        .build_http::<Empty<Bytes>>();
    let uri: http::Uri = url.parse().map_err(|e| format!("{e}"))?;
    let asked = async {
        let response = client
            .get(uri)
            .await
            .map_err(|e| switchyard_engine::describe_chain(&e))?;
        let status = response.status().as_u16();
        let server = response
            .headers()
            .get(http::header::SERVER)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_owned();
        let body = response
            .into_body()
            .collect()
            .await
            .map_err(|e| e.to_string())?;
        Ok((status, server, body.to_bytes()))
    };
    tokio::time::timeout(ASK_TIMEOUT, asked)
        .await
        .map_err(|_| format!("no answer within {} ms", ASK_TIMEOUT.as_millis()))?
}

fn json_of(answer: &Result<(u16, String, Bytes), String>) -> Option<serde_json::Value> {
    match answer {
        Ok((200, _, body)) => serde_json::from_slice(body).ok(),
        _ => None,
    }
}

/// The probe results an adapter reads, from the answers to its probe paths.
async fn probe(url: &str, kind: EngineKind) -> Vec<ProbeResult> {
    let adapter = switchyard_adapters::for_kind(kind);
    let mut results = Vec::new();
    for path in adapter.probes() {
        results.push(match get(&format!("{url}{path}")).await {
            Ok((status, _, body)) => ProbeResult::Response { status, body },
            Err(why) => ProbeResult::Failed(why),
        });
    }
    results
}

/// What answers at `url`: one entry, or one per model for an engine serving several.
async fn identify(url: &str) -> Result<Vec<Found>, String> {
    let models = get(&format!("{url}/v1/models")).await;
    if let Err(why) = &models {
        return Err(why.clone());
    }
    let base = |engine, what: String, model: String| Found {
        url: url.to_owned(),
        engine,
        what,
        model,
        artifact: None,
        upstream_model: None,
    };
    if let Some(props) = json_of(&get(&format!("{url}/props")).await) {
        if props.get("build_info").is_some() || props.get("model_path").is_some() {
            let kind = EngineKind::LlamaCpp;
            let report = switchyard_adapters::for_kind(kind).interpret(&probe(url, kind).await);
            let id = report.identity;
            let model = id
                .served_model
                .clone()
                .or(id.model_path.clone())
                .unwrap_or_default();
            let mut found = base(
                kind,
                format!("llama-server {}", id.build.unwrap_or_default()),
                model,
            );
            found.artifact = id.model_path.filter(|p| Path::new(p).is_file());
            return Ok(vec![found]);
        }
    }
    let server = models
        .as_ref()
        .map(|(_, s, _)| s.clone())
        .unwrap_or_default();
    if server.starts_with("BaseHTTP") {
        // mlx_lm.server: Python's http.server, listing the model it was started with.
        let kind = EngineKind::Mlx;
        let report = switchyard_adapters::for_kind(kind).interpret(&probe(url, kind).await);
        let model = report.identity.served_model.unwrap_or_default();
        let mut found = base(kind, "mlx_lm.server".to_owned(), model.clone());
        found.artifact = Some(model).filter(|p| Path::new(p).is_dir());
        return Ok(vec![found]);
    }
    let what = match json_of(&get(&format!("{url}/api/version")).await) {
        Some(v) if v.get("version").is_some() => {
            format!("Ollama {}", v["version"].as_str().unwrap_or(""))
        }
        _ if json_of(&get(&format!("{url}/api/v0/models")).await).is_some() => {
            "LM Studio".to_owned()
        }
        _ => "an OpenAI-compatible engine".to_owned(),
    };
    let ids: Vec<String> = json_of(&models)
        .and_then(|v| {
            v["data"].as_array().map(|d| {
                d.iter()
                    .filter_map(|m| m["id"].as_str().map(str::to_owned))
                    .collect()
            })
        })
        .unwrap_or_default();
    if ids.is_empty() {
        return Err("answers /v1/models without a model in it".to_owned());
    }
    Ok(ids
        .into_iter()
        .map(|id| {
            let mut found = base(EngineKind::OpenAi, what.clone(), id.clone());
            found.upstream_model = Some(id);
            found
        })
        .collect())
}

fn port_of(url: &str) -> Option<u16> {
    url.rsplit(':').next()?.parse().ok()
}

/// `127.0.0.1:8080`, or the next port from there that no engine found uses and is free now.
fn free_listen(taken: &[u16]) -> SocketAddr {
    (8080..8200)
        .filter(|p| !taken.contains(p))
        .map(|p| SocketAddr::from(([127, 0, 0, 1], p)))
        .find(|a| std::net::TcpListener::bind(a).is_ok())
        .unwrap_or_else(|| SocketAddr::from(([127, 0, 0, 1], 8080)))
}

/// A name Switchyard accepts (letters, digits, `-`, `_`, `.`), from a model id or path:
/// `/models/SmolLM2-135M-Instruct.Q4_1.gguf` → `smollm2-135m-instruct.q4_1`.
fn name_from(model: &str) -> String {
    let last = model
        .trim_end_matches('/')
        .rsplit('/')
        .next()
        .unwrap_or(model);
    let stem = last.strip_suffix(".gguf").unwrap_or(last);
    let name: String = stem
        .chars()
        .map(|c| match c {
            c if c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.') => {
                c.to_ascii_lowercase()
            }
            _ => '-',
        })
        .collect();
    let name = name.trim_matches('-').to_owned();
    if name.is_empty() {
        "model".to_owned()
    } else {
        name
    }
}

/// `name` as a TOML key: bare when it can be, quoted when it has a dot.
fn toml_key(name: &str) -> String {
    if name.contains('.') {
        format!("{name:?}")
    } else {
        name.to_owned()
    }
}

/// `name`, or `name-2`, `name-3`… when it is taken.
fn unique(name: String, taken: &mut Vec<String>) -> String {
    let mut candidate = name.clone();
    let mut n = 2;
    while taken.contains(&candidate) {
        candidate = format!("{name}-{n}");
        n += 1;
    }
    taken.push(candidate.clone());
    candidate
}

/// The configuration text (the server, a ledger beside the file, and one backend and one model
/// per engine and model found) and each one's public model name; the model at `catch_all`
/// takes every name no other model has.
fn render(found: &[Found], listen: SocketAddr, catch_all: Option<usize>) -> (String, Vec<String>) {
    let mut text = format!(
        "# Switchyard configuration written by `switchyard init` for the engines it found.\n\
         # Every key and its default: deploy/configs/example.toml. Check: switchyard check.\n\
         # Relative paths are read from this file's folder.\n\n\
         [server]\nlisten = \"{listen}\"\n\n\
         # One row per request; `switchyard report` reads it.\n\
         [ledger]\n\
         path = \"switchyard.db\"\n"
    );
    let (mut backends, mut models) = (Vec::new(), Vec::new());
    for (i, f) in found.iter().enumerate() {
        let kind = match f.engine {
            EngineKind::LlamaCpp => "llama",
            EngineKind::Mlx => "mlx",
            _ => "openai",
        };
        let backend = unique(kind.to_owned(), &mut backends);
        let model = unique(name_from(&f.model), &mut models);
        let _ = write!(
            text,
            "\n# {what} at {url}, serving {served}\n[backends.{backend}]\nengine = \"{engine}\"\nurl = \"{url}\"\n",
            what = f.what.trim(),
            url = f.url,
            served = f.model,
            engine = f.engine.as_str(),
        );
        match &f.artifact {
            Some(path) => {
                let _ = writeln!(text, "# Hashed: every answer is stamped with its digest, and refused (503) unless the\n# engine is verified to serve it.\nartifact = {path:?}\nrequire_verified_identity = true");
            }
            None => {
                let _ = writeln!(text, "# The engine names no model file here: give it to have answers stamped with its digest.\n# artifact = \"/path/to/model\"");
            }
        }
        if let Some(upstream) = &f.upstream_model {
            let _ = writeln!(text, "upstream_model = {upstream:?}");
        }
        let _ = write!(
            text,
            "\n[models.{}]\nprimary = \"{backend}\"\n",
            toml_key(&model)
        );
        if catch_all == Some(i) {
            text.push_str("# Coding agents send model names of their own, changed with each release: this\n# model takes every name no other model or alias has.\npatterns = [\"*\"]\n");
        }
    }
    (text, models)
}

#[cfg(test)]
mod tests;
