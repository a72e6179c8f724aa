//! Named admin tokens, stored as digests.
//!
//! The file (`admin.tokens`) has one token per line, `NAME sha256:HEX`, where HEX is the SHA-256
//! of the token; `#` starts a comment. A token is 32 random bytes (`sya_` and 64 hex digits):
//! with that much entropy a plain SHA-256 is as good as a slow password hash, and checking a
//! token costs one hash. The file is read at every admin call, so a token added or removed
//! takes effect at once. A presented token is compared with every stored digest, in constant
//! time, whatever matches.

use std::io::Write as _;
use std::path::Path;

use sha2::{Digest as _, Sha256};
use subtle::ConstantTimeEq as _;

/// What a token begins with, so that one found in a log or a shell history says what it is.
const PREFIX: &str = "sya_";

/// One stored token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub name: String,
    digest: [u8; 32],
}

/// Reads the tokens file. Every malformed line is an error naming its line number, and so is a
/// file others may write to (whoever can add a line can let themselves in).
pub fn read(path: &Path) -> Result<Vec<Entry>, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    writable_by_others(path)?;
    parse(&text).map_err(|e| format!("{}: {e}", path.display()))
}

#[cfg(unix)]
fn writable_by_others(path: &Path) -> Result<(), String> {
    use std::os::unix::fs::PermissionsExt as _;
    let mode = std::fs::metadata(path)
        .map_err(|e| format!("{}: {e}", path.display()))?
        .permissions()
        .mode();
    if mode & 0o022 != 0 {
        return Err(format!(
            "{}: writable by others (mode {:o}); make it the owner's alone: chmod 600",
            path.display(),
            mode & 0o777
        ));
    }
    Ok(())
}

#[cfg(not(unix))]
fn writable_by_others(_path: &Path) -> Result<(), String> {
    Ok(())
}

fn parse(text: &str) -> Result<Vec<Entry>, String> {
    let mut entries: Vec<Entry> = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let bad = |why: &str| format!("line {}: {why}", n + 1);
        let mut fields = line.split_whitespace();
        let (Some(name), Some(digest), None) = (fields.next(), fields.next(), fields.next()) else {
            return Err(bad("expected `NAME sha256:HEX`"));
        };
        if !valid_name(name) {
            return Err(bad("a name is 1–64 letters, digits, `-`, `_` or `.`"));
        }
        let digest = digest
            .strip_prefix("sha256:")
            .and_then(from_hex)
            .ok_or_else(|| bad("the digest is `sha256:` and 64 hex digits"))?;
        if entries.iter().any(|e| e.name == name) {
            return Err(bad(&format!("the name {name} is taken by an earlier line")));
        }
        entries.push(Entry {
            name: name.to_owned(),
            digest,
        });
    }
    Ok(entries)
}

pub fn valid_name(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
}

fn from_hex(hex: &str) -> Option<[u8; 32]> {
    if hex.len() != 64 {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(hex.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(out)
}

fn digest(token: &str) -> [u8; 32] {
    Sha256::digest(token.as_bytes()).into()
}

/// The name of the entry whose token `presented` is, if any. Every entry is compared, each in
/// constant time.
pub fn check<'a>(entries: &'a [Entry], presented: &str) -> Option<&'a str> {
    let presented = digest(presented);
    let mut found = None;
    for entry in entries {
        if bool::from(entry.digest.ct_eq(&presented)) {
            found = Some(entry.name.as_str());
        }
    }
    found
}

/// Creates a token named `name`, appends its digest to the file at `path` (created, readable by
/// its owner only, when missing) and returns the token. Refuses a name already there.
pub fn add(path: &Path, name: &str) -> Result<String, String> {
    if !valid_name(name) {
        return Err(format!(
            "{name:?}: a name is 1–64 letters, digits, `-`, `_` or `.`"
        ));
    }
    let text = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
        Err(e) => return Err(format!("{}: {e}", path.display())),
    };
    let existing = parse(&text).map_err(|e| format!("{}: {e}", path.display()))?;
    if existing.iter().any(|e| e.name == name) {
        return Err(format!(
            "{}: a token named {name} exists already; remove its line first to replace it",
            path.display()
        ));
    }
    let mut secret = [0u8; 32];
    getrandom::fill(&mut secret).map_err(|e| format!("no randomness for a token: {e}"))?;
    let token = format!("{PREFIX}{}", to_hex(&secret));
    // A file edited by hand may not end its last line: the new one must not join it.
    let separator = if text.is_empty() || text.ends_with('\n') {
        ""
    } else {
        "\n"
    };
    let line = format!("{separator}{name} sha256:{}\n", to_hex(&digest(&token)));
    let mut options = std::fs::OpenOptions::new();
    options.create(true).append(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    let mut file = options
        .open(path)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    file.write_all(line.as_bytes())
        .and_then(|()| file.sync_all())
        .map_err(|e| format!("{}: {e}", path.display()))?;
    Ok(token)
}

fn to_hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests;
