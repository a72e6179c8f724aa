//! Fingerprints: artifact digests, workload and sampling identities, output hashes.

pub mod artifact;
pub mod output;
pub mod prefix;
pub mod workload;

pub use artifact::{hex, prefixed_hex, ArtifactDigest, DigestCache};
pub use output::OutputHasher;
pub use workload::{fingerprint_raw, WorkloadFingerprint};
