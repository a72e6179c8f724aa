//! The offload detector, for the llama.cpp engines Switchyard runs: fewer of the model's layers
//! on the GPU than the launch asked for. The engine then runs them on the CPU, still answers
//! every request, and is several times slower; llama.cpp says so only once, in its start-up
//! output (`load_tensors: offloaded 20/31 layers to GPU`, or `no usable GPU found, --gpu-layers
//! option will be ignored`), which Switchyard reads as it forwards the engine's output to its
//! log.
//!
//! The intent is the launch's `-ngl` (`--gpu-layers`, `--n-gpu-layers`, or the
//! `LLAMA_ARG_N_GPU_LAYERS` environment variable): a number, `all`, or `auto` (llama.cpp's
//! default: as many as fit). Degraded when the engine put fewer layers on the GPU than asked
//! (all of them for `all` and `auto`, else at most the number asked), or found no GPU at all
//! while some were asked for; clear when it put what was asked; no verdict until the engine has
//! said (a build without GPU support says nothing unless `-ngl` is given) or when `-ngl 0`
//! asked for none.

use serde::{Deserialize, Serialize};
use serde_json::json;

use super::{Judged, Mode};

/// `[detectors.offload]`.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct OffloadConfig {
    pub mode: Mode,
}

impl Default for OffloadConfig {
    fn default() -> Self {
        Self { mode: Mode::Warn }
    }
}

/// How many layers the launch asked to have on the GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Intent {
    Layers(u32),
    All,
    /// As many as fit (llama.cpp's default when `-ngl` is not given).
    Auto,
}

impl Intent {
    /// The intent of a launch's arguments and environment: the last `-ngl` given (an argument
    /// wins over the environment, as in llama.cpp), else `auto`. None for a value llama.cpp
    /// would not take either.
    pub fn of<'a>(
        argv: &'a [String],
        env: impl IntoIterator<Item = (&'a String, &'a String)>,
    ) -> Option<Intent> {
        let flags = ["-ngl", "--gpu-layers", "--n-gpu-layers"];
        let mut given = env
            .into_iter()
            .find(|(k, _)| k.as_str() == "LLAMA_ARG_N_GPU_LAYERS")
            .map(|(_, v)| v.as_str());
        let mut args = argv.iter().skip(1);
        while let Some(arg) = args.next() {
            if flags.contains(&arg.as_str()) {
                given = args.next().map(String::as_str);
            } else if let Some((flag, value)) = arg.split_once('=') {
                if flags.contains(&flag) {
                    given = Some(value);
                }
            }
        }
        match given.map(str::trim) {
            None | Some("auto") => Some(Intent::Auto),
            Some("all") => Some(Intent::All),
            // llama.cpp reads a negative count as all of them.
            Some(n) => match n.parse::<i64>().ok()? {
                n if n < 0 => Some(Intent::All),
                n => Some(Intent::Layers(u32::try_from(n).unwrap_or(u32::MAX))),
            },
        }
    }

    fn describe(self) -> String {
        match self {
            Intent::Layers(n) => format!("-ngl {n}"),
            Intent::All => "-ngl all".to_owned(),
            Intent::Auto => "-ngl auto (the default)".to_owned(),
        }
    }
}

/// What the engine said of its layers on the GPU.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct GpuLayers {
    /// Layers on the GPU, and of how many (unknown when it found no GPU at all).
    pub on_gpu: u32,
    pub of: Option<u32>,
    /// The line it said so in.
    pub line: String,
}

impl GpuLayers {
    /// What `line` of llama.cpp's output says of the layers on the GPU, if anything.
    pub fn from_line(line: &str) -> Option<Self> {
        if line.contains("no usable GPU found") {
            return Some(Self {
                on_gpu: 0,
                of: None,
                line: line.trim().to_owned(),
            });
        }
        let rest = &line[line.find("offloaded ")? + "offloaded ".len()..];
        let (counts, tail) = rest.split_once(' ')?;
        if !tail.starts_with("layers to GPU") {
            return None;
        }
        let (on, of) = counts.split_once('/')?;
        Some(Self {
            on_gpu: on.parse().ok()?,
            of: Some(of.parse().ok()?),
            line: line.trim().to_owned(),
        })
    }
}

/// The rule of the offload detector, for people (it travels with every detection).
pub fn offload_rule() -> String {
    "fewer layers on the GPU than the launch's -ngl asked for (all of them for `all` and `auto`), as the engine's start-up output says, or no usable GPU at all while some were asked for; clear when the engine put what was asked".to_owned()
}

/// Judges what the engine said (`seen`, none yet) against the launch's intent; `slower`: the
/// slowdown detector finds the engine slower now (said with the finding: an offload is what
/// usually makes it so).
pub fn offload(intent: Option<Intent>, seen: Option<&GpuLayers>, slower: bool) -> Judged {
    let Some(intent) = intent else {
        return Judged::Unsure("the launch's -ngl is not a number, `all` or `auto`".to_owned());
    };
    if intent == Intent::Layers(0) {
        return Judged::Unsure("the launch asks for no layer on the GPU (-ngl 0)".to_owned());
    }
    let Some(seen) = seen else {
        return Judged::Unsure(
            "the engine has not said how many layers it put on the GPU".to_owned(),
        );
    };
    let expected = match (intent, seen.of) {
        (Intent::Layers(n), Some(of)) => n.min(of),
        (Intent::Layers(n), None) => n,
        (Intent::All | Intent::Auto, Some(of)) => of,
        (Intent::All | Intent::Auto, None) => 1,
    };
    let figures = json!({
        "intent": intent,
        "on_gpu": seen.on_gpu,
        "layers": seen.of,
        "expected": expected,
        "line": seen.line,
        "slower": slower,
    });
    if seen.on_gpu >= expected {
        return Judged::Clear { figures };
    }
    let found = match seen.of {
        Some(of) => format!("{} of {of} layers on the GPU", seen.on_gpu),
        None => "no usable GPU: every layer on the CPU".to_owned(),
    };
    let slower = if slower {
        "; the engine is slower than its baseline too"
    } else {
        ""
    };
    Judged::Degraded {
        summary: format!("{found}, launched with {}{slower}", intent.describe()),
        figures,
    }
}
