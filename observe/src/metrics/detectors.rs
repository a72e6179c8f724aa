//! The fail-soft detectors' series.
//!
//! | family | type | labels |
//! | --- | --- | --- |
//! | `switchyard_engine_degraded` | gauge | `backend`, `detector` (1 while degraded) |

use std::sync::Arc;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use super::Metrics;

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct DegradedLabels {
    backend: Arc<str>,
    detector: &'static str,
}

/// The families, registered once.
#[derive(Debug)]
pub(super) struct DetectorMetrics {
    degraded: Family<DegradedLabels, Gauge>,
}

impl DetectorMetrics {
    pub(super) fn register(registry: &mut Registry) -> Self {
        let f = Self {
            degraded: Family::default(),
        };
        registry.register(
            "switchyard_engine_degraded",
            "1 while a fail-soft detector finds the engine degraded (it still answers, worse than its own baseline), else 0; the series appears once the detector has judged the engine",
            f.degraded.clone(),
        );
        f
    }
}

impl Metrics {
    /// Sets whether `detector` finds `backend` degraded. Called per window, not per request.
    pub fn engine_degraded(&self, backend: &Arc<str>, detector: &'static str, degraded: bool) {
        self.detectors
            .degraded
            .get_or_create(&DegradedLabels {
                backend: backend.clone(),
                detector,
            })
            .set(i64::from(degraded));
    }
}
