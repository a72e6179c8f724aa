//! The commands that work on recorded or sent requests rather than serving them:
//! `switchyard compare` ([`compare`]: runs a prompt suite on two backends and judges the pairs),
//! `switchyard report` ([`report`]: reads the ledger back as tables), and `switchyard baseline`
//! ([`baseline`]: runs a prompt suite on one backend and writes the record).

pub mod baseline;
pub mod compare;
pub mod render;
pub mod report;
