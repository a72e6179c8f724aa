//! Canary releases, as pure decisions: the plan a release walks ([`plan`]), which arm serves a
//! request ([`split`]), and what the release does next given its evidence ([`decide`]). The
//! proxy counts the evidence from the ledger, records every decision, and moves the traffic.

pub mod decide;
pub mod plan;
pub mod split;

pub use decide::{decide, Decision, Evidence};
pub use plan::{OnMismatch, Performance, Plan, Step, Tolerance};
pub use split::{arm, point, Arm, KeySource};

#[cfg(test)]
mod tests;
