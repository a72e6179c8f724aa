//! The report as people and tools read it: one Markdown table with the targets under it, and the
//! same as JSON.

use serde_json::{json, Value};

use super::stats::median;
use super::verdicts::{Blocks, Verdict};
use super::{Measure, Report, ROUNDS_PER_BLOCK};

impl Report {
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
                pooled: [p_without, p_with, p_control],
                rounds: [ref r_without, ref r_with, ref r_control],
            } = row.measure
            {
                let [without, with, control] = [r_without, r_with, r_control].map(|r| median(r));
                let b = Blocks::read(r_with, r_without, r_control);
                let (ratio, lo, hi) = b.ratio;
                let (control_ratio, control_lo, control_hi) = b.control;
                let cells = format!(
                    "median block: {ratio:.2} (resampled: {lo:.2}–{hi:.2}; {} blocks; median \
                     rounds {with:.0} µs with, {without:.0} µs without); control {control_ratio:.2} \
                     (resampled: {control_lo:.2}–{control_hi:.2}) (pooled: {:.2}, control {:.2})",
                    b.n,
                    p_with / p_without,
                    p_control / p_without
                );
                md.push_str(&format!(
                    " {cells} |{}\n",
                    " |".repeat(self.names.len() + 1)
                ));
                rows.push(json!({"measure": row.metric, "with_us": number(with), "without_us": number(without),
                    "control_us": number(control), "ratio": number(ratio), "control_ratio": number(control_ratio),
                    "blocks": b.n, "rounds_per_block": ROUNDS_PER_BLOCK,
                    "control_resampled_ratio_5_95": [number(control_lo), number(control_hi)],
                    "pooled": {"with_us": number(p_with), "without_us": number(p_without), "ratio": number(p_with / p_without),
                        "control_us": number(p_control), "control_ratio": number(p_control / p_without)},
                    "resampled_ratio_5_95": [number(lo), number(hi)],
                    "rounds_p99_us": {"without": r_without, "with": r_with, "control": r_control}}));
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
                Verdict::Met => "met",
                Verdict::Missed => "MISSED",
                Verdict::Inconclusive => "inconclusive (the run cannot tell)",
                Verdict::Unsteady => {
                    "inconclusive (the control, alike without shadows, reads apart from 1 beyond the blocks' spread: this run's noise is larger than its spread says)"
                }
            };
            md.push_str(&format!("- {what}: {value} — {verdict}\n"));
            targets.push(json!({"target": what, "value": value, "verdict": verdict}));
        }
        // Each target's rounds by cycle, by the target's name.
        let by_name = |cycles: &[Vec<f64>]| -> serde_json::Map<String, Value> {
            self.names
                .iter()
                .zip(cycles)
                .map(|(name, values)| ((*name).to_owned(), json!(values)))
                .collect()
        };
        let json = json!({"config": config, "rows": rows, "targets": targets,
            "c1_rounds_p50_us": by_name(&self.c1_cycles), "c32_rounds_rps": by_name(&self.c32_cycles)});
        (md, json)
    }
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
