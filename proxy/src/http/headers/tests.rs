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

#[test]
fn a_clients_credentials_stay_on_its_hop() {
    for name in ["authorization", "x-api-key", "cookie"] {
        let name = HeaderName::from_static(name);
        assert!(is_client_credential(&name), "{name}");
    }
    for name in [header::CONTENT_TYPE, X_REQUEST_ID, header::USER_AGENT] {
        assert!(!is_client_credential(&name), "{name}");
    }
}
