//! The table `switchyard-perf` prints (Markdown) and writes (JSON): each measure per target, and
//! Switchyard's as a ratio to direct and to nginx; latencies also as the time added over direct;
//! then the targets, met or missed.

use serde_json::{json, Value};

/// The throughput row held for `--sustained-secs`.
pub(crate) const SUSTAINED: &str = "chat c=32 sustained req/s";

/// What a row holds; decides its derived rows, its ratios and its formatting.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Measure {
    /// Microseconds, lower is better; followed by a row of time added over direct.
    Latency,
    /// Time added over direct (derived from a latency row).
    Added,
    /// Requests per second, higher is better.
    Throughput,
    /// KiB of resident memory (Switchyard only), shown in MiB.
    Memory,
    /// Not measured, with why.
    Pending(String),
    /// A count or fact stated in words (the ledger's records written and dropped).
    Text(String),
    /// Switchyard's primary p99 without and with shadowing (µs), and a control's: a second
    /// Switchyard without shadows, alternated with the two. `[without, with, control]`, each the
    /// median of the rounds' p99s (what the target is read from) and the p99 of all rounds'
    /// latencies pooled.
    Shadow { median: [f64; 3], pooled: [f64; 3] },
}

#[derive(Debug)]
struct Row {
    metric: String,
    measure: Measure,
    /// Per target, in the order of `Report::names`; NaN where it does not apply.
    values: Vec<f64>,
}

/// Rows in the order they were measured.
#[derive(Debug)]
pub(crate) struct Report {
    names: Vec<&'static str>,
    rows: Vec<Row>,
}

impl Report {
    pub(crate) fn new(names: Vec<&'static str>) -> Self {
        Self {
            names,
            rows: Vec::new(),
        }
    }

    fn index(&self, name: &str) -> Option<usize> {
        self.names.iter().position(|n| *n == name)
    }

    /// A latency row and the row of what each proxy adds over direct.
    pub(crate) fn latency(&mut self, metric: &str, values: impl Iterator<Item = f64>) {
        let values: Vec<f64> = values.collect();
        let direct = self.index("direct").map_or(f64::NAN, |i| values[i]);
        let added = values
            .iter()
            .zip(&self.names)
            .map(|(v, n)| if *n == "direct" { f64::NAN } else { v - direct })
            .collect();
        self.rows.push(Row {
            metric: metric.to_owned(),
            measure: Measure::Latency,
            values,
        });
        self.rows.push(Row {
            metric: added_label(metric),
            measure: Measure::Added,
            values: added,
        });
    }

    pub(crate) fn throughput(&mut self, metric: &str, values: impl Iterator<Item = f64>) {
        self.rows.push(Row {
            metric: metric.to_owned(),
            measure: Measure::Throughput,
            values: values.collect(),
        });
    }

    /// Switchyard's resident set in KiB.
    pub(crate) fn memory(&mut self, metric: &str, kib: u64) {
        let values = self
            .names
            .iter()
            .map(|n| {
                if *n == "Switchyard" {
                    kib as f64
                } else {
                    f64::NAN
                }
            })
            .collect();
        self.rows.push(Row {
            metric: metric.to_owned(),
            measure: Measure::Memory,
            values,
        });
    }

    /// The primary's p99 through a Switchyard without shadows, through one alike but for
    /// shadowing every request, and through a second one without shadows (the control: `control
    /// ÷ without` is what the same comparison reads when nothing differs); as the median round's
    /// and pooled over the rounds.
    pub(crate) fn shadow(&mut self, metric: &str, median: [f64; 3], pooled: [f64; 3]) {
        self.rows.push(Row {
            metric: metric.to_owned(),
            measure: Measure::Shadow { median, pooled },
            values: vec![f64::NAN; self.names.len()],
        });
    }

    pub(crate) fn pending(&mut self, metric: &str, why: &str) {
        self.rows.push(Row {
            metric: metric.to_owned(),
            measure: Measure::Pending(why.to_owned()),
            values: vec![f64::NAN; self.names.len()],
        });
    }

    pub(crate) fn text(&mut self, metric: &str, text: &str) {
        self.rows.push(Row {
            metric: metric.to_owned(),
            measure: Measure::Text(text.to_owned()),
            values: vec![f64::NAN; self.names.len()],
        });
    }

    fn value(&self, metric: &str, target: &str) -> f64 {
        let (Some(row), Some(i)) = (
            self.rows.iter().find(|r| r.metric == metric),
            self.index(target),
        ) else {
            return f64::NAN;
        };
        row.values[i]
    }

    /// `target`'s value over `base`'s, for a row: for added rows the ratio of added times.
    fn ratio(&self, row: &Row, target: &str, base: &str) -> f64 {
        match (self.index(target), self.index(base)) {
            (Some(t), Some(b)) => row.values[t] / row.values[b],
            _ => f64::NAN,
        }
    }

    /// The targets: (what, value, limit, met). Throughput is met only if the sustained
    /// reading (when taken) meets it too.
    fn targets(&self) -> Vec<(String, String, bool)> {
        let sw_added = self.value(&added_label("chat c=1 p50 µs"), "Switchyard");
        let nginx_added = self.value(&added_label("chat c=1 p50 µs"), "nginx");
        let litellm_added = self.value(&added_label("chat c=1 p50 µs"), "LiteLLM");
        let rps =
            self.value("chat c=32 req/s", "Switchyard") / self.value("chat c=32 req/s", "nginx");
        let sustained = self.value(SUSTAINED, "Switchyard") / self.value(SUSTAINED, "nginx");
        let chunk = self.value(&added_label("stream per-chunk delay p99 µs"), "Switchyard");
        let rss = self
            .rows
            .iter()
            .rev()
            .find(|r| r.measure == Measure::Memory)
            .and_then(|r| self.index("Switchyard").map(|i| r.values[i] / 1024.0))
            .unwrap_or(f64::NAN);
        let a = sw_added / nginx_added;
        let l = litellm_added / sw_added;
        let mut targets = Vec::new();
        for row in &self.rows {
            if let Measure::Shadow {
                median: [without, with, control],
                pooled: [p_without, p_with, p_control],
            } = row.measure
            {
                let r = with / without;
                targets.push((
                    format!(
                        "{} (median round): ≤ 1.05",
                        row.metric.trim_end_matches(": with ÷ without")
                    ),
                    format!(
                        "{with:.0} µs with, {without:.0} µs without: {r:.2}× \
                         (control, alike without shadows: {:.2}×; pooled over the rounds: \
                         {:.2}×, control {:.2}×)",
                        control / without,
                        p_with / p_without,
                        p_control / p_without
                    ),
                    r <= 1.05,
                ));
            }
        }
        targets.extend([
            (
                "added p50 at c=1 ≤ 1.5 × nginx's".to_owned(),
                format!("{sw_added:.0} µs vs nginx {nginx_added:.0} µs: {a:.2}×"),
                a <= 1.5,
            ),
            (
                "throughput at c=32 ≥ 0.8 × nginx's".to_owned(),
                format!("{rps:.2}× in the rounds, {sustained:.2}× sustained"),
                rps >= 0.8 && (sustained.is_nan() || sustained >= 0.8),
            ),
            (
                "added p50 ≤ 1/50 of LiteLLM's".to_owned(),
                format!("LiteLLM adds {litellm_added:.0} µs: {l:.0}× Switchyard's"),
                l >= 50.0,
            ),
            (
                "added per-chunk delay p99 ≤ 1 ms".to_owned(),
                format!("{chunk:.0} µs"),
                chunk <= 1000.0,
            ),
            (
                "RSS with the open streams ≤ 64 MiB".to_owned(),
                format!("{rss:.1} MiB"),
                rss <= 64.0,
            ),
        ]);
        targets
    }

    /// The Markdown table (and the targets under it) and the same as JSON.
    pub(crate) fn render(&self, config: &Value) -> (String, Value) {
        let mut md = String::from("| measure |");
        for n in &self.names {
            md.push_str(&format!(" {n} |"));
        }
        md.push_str(" Switchyard ÷ direct | Switchyard ÷ nginx |\n|---|");
        md.push_str(&"---:|".repeat(self.names.len() + 2));
        md.push('\n');
        let mut rows = Vec::new();
        for row in &self.rows {
            md.push_str(&format!("| {} |", row.metric));
            // Rows stated in words: the words in the first column, the JSON key saying which.
            let words = match &row.measure {
                Measure::Pending(why) => Some(("pending", why)),
                Measure::Text(text) => Some(("text", text)),
                _ => None,
            };
            if let Some((key, words)) = words {
                md.push_str(&format!(
                    " {words} |{}\n",
                    " |".repeat(self.names.len() + 1)
                ));
                rows.push(json!({"measure": row.metric, key: words}));
                continue;
            }
            if let Measure::Shadow {
                median: [without, with, control],
                pooled: [p_without, p_with, p_control],
            } = row.measure
            {
                let cells = format!(
                    "median round: {with:.0} µs with ÷ {without:.0} µs without = {:.2}; control \
                     {control:.0} µs = {:.2} (pooled: {:.2}, control {:.2})",
                    with / without,
                    control / without,
                    p_with / p_without,
                    p_control / p_without
                );
                md.push_str(&format!(
                    " {cells} |{}\n",
                    " |".repeat(self.names.len() + 1)
                ));
                rows.push(json!({"measure": row.metric, "with_us": number(with), "without_us": number(without), "ratio": number(with / without),
                    "control_us": number(control), "control_ratio": number(control / without),
                    "pooled": {"with_us": number(p_with), "without_us": number(p_without), "ratio": number(p_with / p_without),
                        "control_us": number(p_control), "control_ratio": number(p_control / p_without)}}));
                continue;
            }
            for v in &row.values {
                md.push_str(&format!(" {} |", fmt(&row.measure, *v)));
            }
            let over_direct = if row.measure == Measure::Added {
                f64::NAN
            } else {
                self.ratio(row, "Switchyard", "direct")
            };
            let over_nginx = self.ratio(row, "Switchyard", "nginx");
            md.push_str(&format!(
                " {} | {} |\n",
                fmt_ratio(over_direct),
                fmt_ratio(over_nginx)
            ));
            let mut values = serde_json::Map::new();
            for (n, v) in self.names.iter().zip(&row.values) {
                values.insert((*n).to_owned(), number(*v));
            }
            rows.push(json!({
                "measure": row.metric,
                "values": values,
                "switchyard_over_direct": number(over_direct),
                "switchyard_over_nginx": number(over_nginx),
                "litellm_over_direct": number(if row.measure == Measure::Added { f64::NAN } else { self.ratio(row, "LiteLLM", "direct") }),
                "litellm_over_nginx": number(self.ratio(row, "LiteLLM", "nginx")),
            }));
        }
        md.push_str("\nTargets:\n");
        let mut targets = Vec::new();
        for (what, value, met) in self.targets() {
            // NaN compares false: a target whose inputs were not measured (a skipped target).
            let verdict = match met {
                _ if value.contains("NaN") => "not measured",
                true => "met",
                false => "MISSED",
            };
            md.push_str(&format!("- {what}: {value} — {verdict}\n"));
            targets.push(json!({"target": what, "value": value, "verdict": verdict}));
        }
        let json = json!({"config": config, "rows": rows, "targets": targets});
        (md, json)
    }
}

fn added_label(metric: &str) -> String {
    format!("{}, added over direct", metric.trim_end_matches(" µs")) + " µs"
}

fn fmt(measure: &Measure, v: f64) -> String {
    if v.is_nan() {
        return "—".to_owned();
    }
    match measure {
        Measure::Memory => format!("{:.1}", v / 1024.0),
        Measure::Added => format!("{v:+.0}"),
        _ => format!("{v:.0}"),
    }
}

fn fmt_ratio(v: f64) -> String {
    if v.is_finite() {
        format!("{v:.2}")
    } else {
        "—".to_owned()
    }
}

fn number(v: f64) -> Value {
    serde_json::Number::from_f64(v).map_or(Value::Null, Value::Number)
}
