//! Which arm of a release serves a request: a hash of the request's sticky key and the
//! release's id, compared with the step's weight.
//!
//! The same key always hashes to the same point in `[0, 100)`, and the candidate serves the
//! points below the weight: a session on the candidate at 5 % stays there at 25 % and 50 %, and
//! no session moves back while the weight rises. The hash is SHA-256, the same on every
//! machine and in every version, so a restart or an upgrade moves no session either.

use sha2::{Digest as _, Sha256};

/// The side of a release that serves a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arm {
    Primary,
    Candidate,
}

impl Arm {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Primary => "primary",
            Self::Candidate => "candidate",
        }
    }
}

/// Where a request's sticky key came from, recorded with its arm.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeySource {
    /// The configured session header (e.g. `x-session-id`).
    Header,
    /// The OpenAI `user` field.
    User,
    /// The system prompt and the first user message.
    Prompt,
    /// No key: this request alone was split.
    Request,
}

impl KeySource {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Header => "header",
            Self::User => "user",
            Self::Prompt => "prompt",
            Self::Request => "request",
        }
    }
}

/// The point of `key` in `[0, 100)` for release `release`: 64 bits of SHA-256 over both.
pub fn point(release: &str, key: &[u8]) -> f64 {
    let mut hash = Sha256::new();
    hash.update(release.as_bytes());
    hash.update([0]);
    hash.update(key);
    let digest = hash.finalize();
    let mut first = [0u8; 8];
    first.copy_from_slice(&digest[..8]);
    // 53 bits fill an f64's mantissa exactly: every point is representable.
    (u64::from_be_bytes(first) >> 11) as f64 / (1u64 << 53) as f64 * 100.0
}

/// The arm that serves a request whose key lies at `point` when the candidate's weight is
/// `weight` percent.
pub fn arm(point: f64, weight: u8) -> Arm {
    if point < f64::from(weight) {
        Arm::Candidate
    } else {
        Arm::Primary
    }
}
