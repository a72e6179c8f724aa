//! `switchyard keys`: client keys added to and revoked from the configuration file.
//!
//! The file is edited as a TOML document (`toml_edit`), so its comments, order and layout stay
//! as they were: only the `[auth.keys.NAME]` entry is added or removed. An edit is written to a
//! file beside the configuration, read back and validated as `switchyard check` would, and only
//! then renamed over it: a file watcher (`serve --watch-config`) sees the whole change at once,
//! and an edit that would leave the configuration invalid leaves it as it was. `[auth]` itself
//! is kept when its last key is revoked, so the listener stays locked rather than open.

use std::path::{Path, PathBuf};

use switchyard_policy::auth::{digest_text, valid_key_name, KEY_PREFIX};
use toml_edit::{value, Array, DocumentMut, Item, Table};

/// A key to add: its name and limits (see `switchyard_policy::auth::KeyConfig`).
#[derive(Debug, Clone, Default)]
pub struct NewKey {
    pub name: String,
    pub models: Option<Vec<String>>,
    pub rpm: Option<u32>,
    pub concurrency: Option<u32>,
}

/// A new key's text: `sy-` and 32 random bytes in hex.
pub fn generate() -> Result<String, String> {
    let mut secret = [0u8; 32];
    getrandom::fill(&mut secret).map_err(|e| format!("no randomness for a key: {e}"))?;
    let hex: String = secret.iter().map(|b| format!("{b:02x}")).collect();
    Ok(format!("{KEY_PREFIX}{hex}"))
}

/// Creates a key for `new` and adds its entry, with only the key's digest, to the
/// configuration at `path`. Returns the key: it is shown this once.
pub fn add(path: &Path, new: &NewKey) -> Result<String, String> {
    let text = read(path)?;
    let key = generate()?;
    let edited = add_entry(&text, new, &digest_text(key.as_bytes()))?;
    replace(path, &edited)?;
    Ok(key)
}

/// Removes the key named `name` from the configuration at `path`.
pub fn revoke(path: &Path, name: &str) -> Result<(), String> {
    let text = read(path)?;
    let edited = remove_entry(&text, name)?;
    replace(path, &edited)
}

/// `text` with `[auth.keys.NAME]` added: `digest` and the limits of `new` that are set.
pub fn add_entry(text: &str, new: &NewKey, digest: &str) -> Result<String, String> {
    if !valid_key_name(&new.name) {
        return Err(format!(
            "{:?}: a key name is 1–64 letters, digits, `-`, `_` or `.`",
            new.name
        ));
    }
    let mut doc = parse(text)?;
    let keys = keys_table(&mut doc)?;
    if keys.contains_key(&new.name) {
        return Err(format!(
            "a key named {} exists already: revoke it first (`switchyard keys revoke {}`) to replace it",
            new.name, new.name
        ));
    }
    let mut entry = Table::new();
    entry.insert("digest", value(digest));
    if let Some(models) = &new.models {
        entry.insert(
            "models",
            value(models.iter().map(String::as_str).collect::<Array>()),
        );
    }
    if let Some(rpm) = new.rpm {
        entry.insert("rpm", value(i64::from(rpm)));
    }
    if let Some(concurrency) = new.concurrency {
        entry.insert("concurrency", value(i64::from(concurrency)));
    }
    keys.insert(&new.name, Item::Table(entry));
    Ok(doc.to_string())
}

/// `text` without `[auth.keys.NAME]`; `[auth]` stays, even empty.
pub fn remove_entry(text: &str, name: &str) -> Result<String, String> {
    let mut doc = parse(text)?;
    let keys = keys_table(&mut doc)?;
    if keys.remove(name).is_none() {
        return Err(format!("no key named {name} in [auth.keys]"));
    }
    Ok(doc.to_string())
}

fn parse(text: &str) -> Result<DocumentMut, String> {
    text.parse::<DocumentMut>()
        .map_err(|e| format!("not a TOML document: {e}"))
}

/// `[auth.keys]`, created when missing, with `[auth]` written out as a header of its own: an
/// `[auth]` left with no key still asks for one.
fn keys_table(doc: &mut DocumentMut) -> Result<&mut Table, String> {
    let auth = doc
        .entry("auth")
        .or_insert_with(|| Item::Table(Table::new()))
        .as_table_mut()
        .ok_or("`auth` is not a table ([auth]): edit it by hand")?;
    auth.set_implicit(false);
    let keys = auth.entry("keys").or_insert_with(|| {
        let mut keys = Table::new();
        keys.set_implicit(true);
        Item::Table(keys)
    });
    keys.as_table_mut()
        .ok_or_else(|| "`auth.keys` is not a table ([auth.keys.NAME]): edit it by hand".to_owned())
}

fn read(path: &Path) -> Result<String, String> {
    std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))
}

/// Writes `text` over the configuration at `path` once it reads as a valid configuration: to a
/// file beside it first (with its permissions), validated, then renamed over it. A symbolic
/// link is followed: the file it points to is replaced, the link stays.
fn replace(path: &Path, text: &str) -> Result<(), String> {
    let target = std::fs::canonicalize(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let name = target
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let staged: PathBuf = target.with_file_name(format!(".{name}.switchyard-keys"));
    let shown = |e: std::io::Error| format!("{}: {e}", staged.display());
    std::fs::write(&staged, text).map_err(shown)?;
    let checked = std::fs::metadata(&target)
        .and_then(|meta| std::fs::set_permissions(&staged, meta.permissions()))
        .map_err(shown)
        .and_then(|()| super::load_file(&staged).map_err(|e| e.to_string()));
    if let Err(e) = checked {
        let _ = std::fs::remove_file(&staged);
        return Err(format!(
            "the configuration would not be valid after this change; {} is unchanged\n{e}",
            path.display()
        ));
    }
    std::fs::rename(&staged, &target).map_err(|e| {
        let _ = std::fs::remove_file(&staged);
        format!("{}: {e}", target.display())
    })
}

#[cfg(test)]
mod tests;
