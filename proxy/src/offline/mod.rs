//! The commands that work on recorded or sent requests rather than serving them:
//! `switchyard compare` ([`compare`]: runs a prompt suite on two backends and judges the pairs)
//! and `switchyard report` ([`report`]: reads the ledger back as tables).

pub mod compare;
pub mod render;
pub mod report;
