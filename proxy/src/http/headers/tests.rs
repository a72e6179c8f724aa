//! Unit tests of what crosses Switchyard.

use super::*;

#[test]
fn switchyards_own_controls_never_reach_an_engine() {
    // The admin token that forces a release's arm is a credential for Switchyard alone.
    for name in [X_ARM, X_ADMIN_TOKEN, header::CONNECTION, header::TE] {
        assert!(is_hop_by_hop(&name), "{name}");
    }
    for name in [header::AUTHORIZATION, header::CONTENT_TYPE, X_REQUEST_ID] {
        assert!(!is_hop_by_hop(&name), "{name}");
    }
}
