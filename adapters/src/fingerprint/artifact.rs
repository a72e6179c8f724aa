//! Artifact digests: what a model file or folder *is*, whatever it is called.
//!
//! A file's digest is the SHA-256 of its bytes. A folder's (MLX) is the SHA-256 over the sorted
//! lines `relative/path NUL hex-sha256-of-file\n` of every regular file below it. Per-file digests
//! are cached by (path, size, mtime, inode), so a 40 GB artifact is read once per change, and a
//! folder is re-hashed only where a file changed. Hashing is blocking disk I/O: callers run it off
//! the request path (`spawn_blocking`).

use std::collections::HashMap;
use std::fs::{self, File};
use std::io::{self, Read};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::SystemTime;

use sha2::{Digest, Sha256};

/// Read size: large enough that syscalls vanish in the hashing cost.
const CHUNK: usize = 1 << 20;

/// An artifact's digest, written `sha256:<64 hex>`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ArtifactDigest(String);

impl ArtifactDigest {
    fn from_bytes(bytes: &[u8]) -> Self {
        Self(prefixed_hex("sha256:", bytes))
    }

    /// `sha256:<hex>`.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The bare hex, as `sha256sum` prints it.
    pub fn hex(&self) -> &str {
        &self.0["sha256:".len()..]
    }
}

impl std::fmt::Display for ArtifactDigest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// Lower-case hex of `bytes`.
pub fn hex(bytes: &[u8]) -> String {
    prefixed_hex("", bytes)
}

/// `prefix` followed by the lower-case hex of `bytes`, in one allocation: three digests per
/// request are written this way, a table lookup per digit rather than a formatter call.
pub fn prefixed_hex(prefix: &str, bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    // Bytes first, then one check of the whole: a `char` pushed at a time checks the capacity
    // and encodes each digit on its own.
    let mut out = Vec::with_capacity(prefix.len() + bytes.len() * 2);
    out.extend_from_slice(prefix.as_bytes());
    out.extend(
        bytes
            .iter()
            .flat_map(|b| [DIGITS[usize::from(b >> 4)], DIGITS[usize::from(b & 0x0f)]]),
    );
    // The prefix is a str and the digits ASCII: never an error.
    String::from_utf8(out).unwrap_or_default()
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct FileKey {
    path: PathBuf,
    size: u64,
    mtime: Option<SystemTime>,
    inode: u64,
    device: u64,
}

impl FileKey {
    fn of(path: &Path, meta: &fs::Metadata) -> Self {
        Self {
            path: path.to_path_buf(),
            size: meta.len(),
            mtime: meta.modified().ok(),
            inode: meta.ino(),
            device: meta.dev(),
        }
    }
}

/// Per-file digests keyed by (path, size, mtime, inode): a changed file gets a new key.
#[derive(Debug, Default)]
pub struct DigestCache {
    files: Mutex<HashMap<FileKey, [u8; 32]>>,
}

impl DigestCache {
    pub fn new() -> Self {
        Self::default()
    }

    /// The digest of a file or folder at `path`. Blocking.
    pub fn digest(&self, path: &Path) -> io::Result<ArtifactDigest> {
        let meta = fs::metadata(path)?;
        if meta.is_dir() {
            self.digest_dir(path)
        } else {
            Ok(ArtifactDigest::from_bytes(&self.digest_file(path, &meta)?))
        }
    }

    fn digest_file(&self, path: &Path, meta: &fs::Metadata) -> io::Result<[u8; 32]> {
        let key = FileKey::of(path, meta);
        if let Some(d) = self.lock().get(&key) {
            return Ok(*d);
        }
        let digest = sha256_file(path)?;
        self.lock().insert(key, digest);
        Ok(digest)
    }

    fn digest_dir(&self, root: &Path) -> io::Result<ArtifactDigest> {
        let mut files = Vec::new();
        collect_files(root, root, &mut files)?;
        files.sort();
        let mut outer = Sha256::new();
        for relative in &files {
            let full = root.join(relative);
            let meta = fs::metadata(&full)?;
            let digest = self.digest_file(&full, &meta)?;
            outer.update(relative.as_bytes());
            outer.update([0u8]);
            outer.update(hex(&digest).as_bytes());
            outer.update(b"\n");
        }
        Ok(ArtifactDigest::from_bytes(&outer.finalize()))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<FileKey, [u8; 32]>> {
        // A poisoned cache only means a hash was interrupted; the map itself is still sound.
        self.files.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Relative paths (with `/` separators) of the regular files below `dir`, following symlinks.
fn collect_files(root: &Path, dir: &Path, out: &mut Vec<String>) -> io::Result<()> {
    for entry in fs::read_dir(dir)? {
        let entry = entry?;
        let path = entry.path();
        let meta = fs::metadata(&path)?;
        if meta.is_dir() {
            collect_files(root, &path, out)?;
        } else if meta.is_file() {
            let relative = path
                .strip_prefix(root)
                .map_err(|e| io::Error::other(e.to_string()))?;
            let text = relative.to_str().ok_or_else(|| {
                io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("{} is not valid UTF-8", relative.display()),
                )
            })?;
            out.push(text.to_owned());
        }
    }
    Ok(())
}

fn sha256_file(path: &Path) -> io::Result<[u8; 32]> {
    let mut file = File::open(path)?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; CHUNK];
    loop {
        let n = match file.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        hasher.update(&buf[..n]);
    }
    Ok(hasher.finalize().into())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn file_digest_is_plain_sha256() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.gguf");
        fs::write(&path, b"abc").unwrap();
        let d = DigestCache::new().digest(&path).unwrap();
        assert_eq!(
            d.as_str(),
            "sha256:ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }

    #[test]
    fn folder_digest_follows_the_rule_and_tracks_changes() {
        let dir = tempfile::tempdir().unwrap();
        fs::create_dir(dir.path().join("sub")).unwrap();
        fs::write(dir.path().join("b.json"), b"abc").unwrap();
        fs::write(dir.path().join("sub/a.bin"), b"").unwrap();
        let cache = DigestCache::new();
        let d1 = cache.digest(dir.path()).unwrap();

        let mut expected = Sha256::new();
        expected
            .update(b"b.json\0ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad\n");
        expected.update(
            b"sub/a.bin\0e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855\n",
        );
        assert_eq!(d1.hex(), hex(&expected.finalize()));

        let mut f = fs::OpenOptions::new()
            .append(true)
            .open(dir.path().join("b.json"))
            .unwrap();
        f.write_all(b"d").unwrap();
        drop(f);
        let d2 = cache.digest(dir.path()).unwrap();
        assert_ne!(d1, d2, "a changed file must change the folder digest");
    }
}
