//! Unit tests of the admin tokens file.

use super::*;

#[test]
fn an_added_token_checks_under_its_name_and_only_its_digest_is_stored() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("admin-tokens");
    let ops = add(&path, "ops").unwrap();
    let ci = add(&path, "ci").unwrap();
    assert!(ops.starts_with("sya_") && ops.len() == 4 + 64, "{ops}");
    assert_ne!(ops, ci);
    let text = std::fs::read_to_string(&path).unwrap();
    assert!(
        !text.contains(&ops[4..]) && !text.contains(&ci[4..]),
        "{text}"
    );
    let entries = read(&path).unwrap();
    assert_eq!(check(&entries, &ops), Some("ops"));
    assert_eq!(check(&entries, &ci), Some("ci"));
    assert_eq!(check(&entries, "sya_0000"), None);
    assert_eq!(check(&entries, ""), None);
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt as _;
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o077, 0, "{mode:o}");
    }
}

#[test]
fn a_name_is_taken_once_and_must_be_plain() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("admin-tokens");
    add(&path, "ops").unwrap();
    let again = add(&path, "ops").unwrap_err();
    assert!(again.contains("exists already"), "{again}");
    for bad in ["", "two words", "ünï", &"x".repeat(65)] {
        assert!(add(&path, bad).is_err(), "{bad:?}");
    }
    assert_eq!(read(&path).unwrap().len(), 1);
}

#[test]
fn malformed_lines_are_refused_with_their_number() {
    let good = format!("# admin tokens\n\nops sha256:{}\n", "ab".repeat(32));
    assert_eq!(parse(&good).unwrap().len(), 1);
    for (text, line) in [
        (format!("{good}ci\n"), "line 4"),
        (format!("{good}ci sha256:abc\n"), "line 4"),
        (format!("{good}ci md5:{}\n", "ab".repeat(32)), "line 4"),
        (format!("{good}ops sha256:{}\n", "cd".repeat(32)), "line 4"),
        (format!("x y z\n{good}"), "line 1"),
    ] {
        let err = parse(&text).unwrap_err();
        assert!(err.starts_with(line), "{err}");
    }
}

#[test]
fn a_line_added_after_a_hand_edit_stays_a_line_of_its_own() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("admin-tokens");
    std::fs::write(&path, format!("# by hand\nops sha256:{}", "ab".repeat(32))).unwrap();
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    }
    let ci = add(&path, "ci").unwrap();
    let entries = read(&path).unwrap();
    assert_eq!(entries.len(), 2);
    assert_eq!(check(&entries, &ci), Some("ci"));
}

#[cfg(unix)]
#[test]
fn a_file_others_may_write_to_is_refused() {
    use std::os::unix::fs::PermissionsExt as _;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("admin-tokens");
    add(&path, "ops").unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o666)).unwrap();
    let err = read(&path).unwrap_err();
    assert!(
        err.contains("writable by others") && err.contains("chmod 600"),
        "{err}"
    );
}
