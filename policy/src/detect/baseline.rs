//! What an engine's answers show, read back from the ledger ([`Sample`]), and an engine
//! identity's warm baseline of them ([`Baseline`]): what every rule of the detectors compares
//! the latest answers with.

use serde::Serialize;

/// Prompt-size bands, by the prompt's tokens: an engine's rates depend on how long the context
/// is, so each band has its own baseline.
pub const BANDS: [(&str, u64); 4] = [
    ("<256", 256),
    ("256-1k", 1024),
    ("1k-4k", 4096),
    ("4k+", u64::MAX),
];

/// The band of a prompt of `tokens` tokens (an unknown count is the first band's).
pub fn band(tokens: Option<u64>) -> usize {
    let tokens = tokens.unwrap_or(0);
    BANDS
        .iter()
        .position(|(_, below)| tokens < *below)
        .unwrap_or(BANDS.len() - 1)
}

/// The fewest tokens a rate is taken from: fewer are mostly fixed overhead, not speed.
pub const MIN_DECODE_TOKENS: u64 = 8;
pub const MIN_PREFILL_TOKENS: u64 = 32;

/// The rates one recorded answer shows, in tokens per second.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sample {
    /// The ledger row's id.
    pub id: i64,
    pub band: usize,
    pub decode: Option<f64>,
    pub prefill: Option<f64>,
    /// The cached share of the prompt, for an answer whose conversation's earlier turn the
    /// same engine served (then its prompt cache should hold most of it); else none.
    pub cached: Option<f64>,
    /// The share of the answer's time it spent waiting for a slot in Switchyard's queue.
    pub queued: Option<f64>,
    /// Its time to first token (streamed answers).
    pub ttft_ms: Option<f64>,
}

impl Sample {
    /// The rates of an answer that decoded `decode` (tokens, milliseconds) and prefilled
    /// `prefill` (tokens, milliseconds) for a prompt of `prompt_tokens`; a rate from too few
    /// tokens or no time is left out.
    pub fn new(
        id: i64,
        prompt_tokens: Option<u64>,
        decode: (Option<u64>, Option<f64>),
        prefill: (Option<u64>, Option<f64>),
    ) -> Self {
        let rate = |(tokens, ms): (Option<u64>, Option<f64>), least: u64| match (tokens, ms) {
            (Some(t), Some(ms)) if t >= least && ms > 0.0 && ms.is_finite() => {
                Some(t as f64 * 1000.0 / ms)
            }
            _ => None,
        };
        Self {
            id,
            band: band(prompt_tokens),
            decode: rate(decode, MIN_DECODE_TOKENS),
            prefill: rate(prefill, MIN_PREFILL_TOKENS),
            cached: None,
            queued: None,
            ttft_ms: None,
        }
    }

    /// With its time to first token.
    pub fn with_ttft(mut self, ttft_ms: Option<f64>) -> Self {
        self.ttft_ms = ttft_ms.filter(|t| t.is_finite() && *t >= 0.0);
        self
    }

    /// With the share of its time (`total_ms`) the answer waited in the queue (`queue_ms`).
    pub fn with_queue(mut self, queue_ms: Option<f64>, total_ms: Option<f64>) -> Self {
        self.queued = match (queue_ms, total_ms) {
            (Some(q), Some(t)) if t > 0.0 && q >= 0.0 && q.is_finite() => Some((q / t).min(1.0)),
            _ => None,
        };
        self
    }

    /// With the cached share of the answer's prompt (`cached_tokens` of `prompt_tokens`), when
    /// it `continues` a conversation the same engine served and its prompt is long enough to
    /// tell.
    pub fn with_cached(
        mut self,
        continues: bool,
        cached_tokens: Option<u64>,
        prompt_tokens: Option<u64>,
    ) -> Self {
        self.cached = match (continues, cached_tokens, prompt_tokens) {
            (true, Some(cached), Some(prompt)) if prompt >= MIN_CACHE_PROMPT_TOKENS => {
                Some((cached.min(prompt)) as f64 / prompt as f64)
            }
            _ => None,
        };
        self
    }
}

/// The shortest prompt whose cached share is judged: in a shorter one, a few tokens the engine
/// always prefills anew (the last message's template) are most of it.
pub const MIN_CACHE_PROMPT_TOKENS: u64 = 32;

/// The two rates a slowdown is judged on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Metric {
    Decode,
    Prefill,
}

impl Metric {
    pub const ALL: [Metric; 2] = [Metric::Decode, Metric::Prefill];

    pub fn as_str(self) -> &'static str {
        match self {
            Metric::Decode => "decode",
            Metric::Prefill => "prefill",
        }
    }

    pub(super) fn of(self, sample: &Sample) -> Option<f64> {
        match self {
            Metric::Decode => sample.decode,
            Metric::Prefill => sample.prefill,
        }
    }
}

/// The first values of one figure an identity's answers showed, up to the baseline's size, and
/// the ledger row of the last one taken: later rows are judged against them.
#[derive(Debug, Clone, Default, PartialEq)]
pub(super) struct Firsts {
    values: Vec<f64>,
    through: i64,
}

impl Firsts {
    fn learn(&mut self, id: i64, value: Option<f64>, size: u64) {
        if let Some(value) = value.filter(|_| self.len() < size) {
            self.values.push(value);
            self.through = id;
        }
    }

    pub(super) fn len(&self) -> u64 {
        self.values.len() as u64
    }

    /// Their median, once there are `size` of them.
    pub(super) fn median(&self, size: u64) -> Option<f64> {
        (self.len() >= size).then(|| median(&self.values))
    }

    /// Whether row `id` came after the baseline's rows (the baseline's own are not judged).
    pub(super) fn after(&self, id: i64) -> bool {
        id > self.through
    }

    /// The values `pick` reads from `window`'s rows after the baseline's: the latest `keep`.
    pub(super) fn latest(
        &self,
        window: &[Sample],
        pick: impl Fn(&Sample) -> Option<f64>,
        keep: u64,
    ) -> Vec<f64> {
        let values = window
            .iter()
            .filter(|s| self.after(s.id))
            .filter_map(pick)
            .collect();
        latest(values, keep)
    }
}

/// The last `keep` of `values` (oldest first): a window's latest answers.
pub(super) fn latest(mut values: Vec<f64>, keep: u64) -> Vec<f64> {
    let keep = usize::try_from(keep).unwrap_or(usize::MAX);
    if values.len() > keep {
        values.drain(..values.len() - keep);
    }
    values
}

/// One engine identity's baseline: per band and metric, its first warm rates, up to
/// `baseline_requests` (and, shown only, time to first token); across bands, the cached share of
/// its first continuing prompts and the queue's share of its first answers' time (a share does
/// not grow with the prompt).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Baseline {
    pub(super) rates: [[Firsts; 2]; BANDS.len()],
    /// Shown, not judged: the rates say more of the engine, and the first token waits for the
    /// queue too.
    ttft: [Firsts; BANDS.len()],
    pub(super) cached: Firsts,
    pub(super) queued: Firsts,
}

impl Baseline {
    /// Takes `sample` into the baseline where its figures' are not full yet.
    pub fn learn(&mut self, sample: &Sample, size: u64) {
        let (id, band) = (sample.id, sample.band);
        for metric in Metric::ALL {
            self.rates[band][metric as usize].learn(id, metric.of(sample), size);
        }
        self.ttft[band].learn(id, sample.ttft_ms, size);
        self.cached.learn(id, sample.cached, size);
        self.queued.learn(id, sample.queued, size);
    }

    /// The cached share's baseline as shown (admin API): its answers and, once full, median.
    pub fn cache(&self, size: u64) -> CacheBaseline {
        CacheBaseline {
            requests: self.cached.len(),
            cached_share: self.cached.median(size),
        }
    }

    /// The queue's baseline as shown (admin API): its answers and, once full, median share.
    pub fn queue(&self, size: u64) -> QueueBaseline {
        QueueBaseline {
            requests: self.queued.len(),
            queued_share: self.queued.median(size),
        }
    }

    /// The median rate of `band` for `metric`, once its baseline is full.
    pub fn median(&self, band: usize, metric: Metric, size: u64) -> Option<f64> {
        self.rates[band][metric as usize].median(size)
    }

    /// Each band's baseline as shown (admin API): its requests and, once full, its medians.
    pub fn bands(&self, size: u64) -> Vec<BandBaseline> {
        BANDS
            .iter()
            .enumerate()
            .filter(|(b, _)| self.rates[*b].iter().any(|r| r.len() > 0))
            .map(|(b, (name, _))| BandBaseline {
                band: name,
                decode_requests: self.rates[b][Metric::Decode as usize].len(),
                prefill_requests: self.rates[b][Metric::Prefill as usize].len(),
                decode_tokens_per_s: self.median(b, Metric::Decode, size),
                prefill_tokens_per_s: self.median(b, Metric::Prefill, size),
                ttft_ms: self.ttft[b].median(size),
            })
            .collect()
    }
}

/// One band of a baseline, as the admin API shows it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct BandBaseline {
    pub band: &'static str,
    pub decode_requests: u64,
    pub prefill_requests: u64,
    pub decode_tokens_per_s: Option<f64>,
    pub prefill_tokens_per_s: Option<f64>,
    /// The median time to first token of its first streamed answers, once there are enough.
    pub ttft_ms: Option<f64>,
}

/// The cache's baseline, as the admin API shows it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CacheBaseline {
    pub requests: u64,
    pub cached_share: Option<f64>,
}

/// The queue's baseline, as the admin API shows it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct QueueBaseline {
    pub requests: u64,
    pub queued_share: Option<f64>,
}

pub(super) fn median(values: &[f64]) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let n = sorted.len();
    match n {
        0 => f64::NAN,
        _ if n % 2 == 1 => sorted[n / 2],
        _ => (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0,
    }
}
