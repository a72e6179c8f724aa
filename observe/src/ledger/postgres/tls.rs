//! TLS to the shared ledger's server: rustls, trusting the system's roots and, when `ca_file`
//! names them, a private CA's certificates. tokio-postgres asks for TLS as the URL's `sslmode`
//! says (`prefer` by default: TLS when the server offers it); rustls then always verifies the
//! server's certificate and its name, as libpq's `verify-full` does.

use std::path::Path;
use std::sync::Arc;

use rustls::{ClientConfig, RootCertStore};
use rustls_pki_types::pem::PemObject as _;
use rustls_pki_types::CertificateDer;
use tokio_postgres_rustls::MakeRustlsConnect;

/// The connector for the pool's connections.
pub(super) fn connector(ca_file: Option<&Path>) -> Result<MakeRustlsConnect, String> {
    let mut roots = RootCertStore::empty();
    let (system, _) =
        roots.add_parsable_certificates(rustls_native_certs::load_native_certs().certs);
    if let Some(path) = ca_file {
        let certs = CertificateDer::pem_file_iter(path)
            .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
            .map_err(|e| format!("ledger.ca_file {}: {e}", path.display()))?;
        let (ours, _) = roots.add_parsable_certificates(certs);
        if ours == 0 {
            return Err(format!(
                "ledger.ca_file {}: no certificate in it could be used",
                path.display()
            ));
        }
    } else if system == 0 {
        tracing::debug!("no system root certificates: the shared ledger can be reached without TLS only, or with ledger.ca_file");
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS: {e}"))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(MakeRustlsConnect::new(config))
}
