//! TLS to an engine reached over `https://`: rustls, trusting the system's roots and, when the
//! backend names one, a CA file's certificates (a private CA, or the engine's own self-signed
//! certificate). Only HTTP/1.1 is offered, as on plain connections.

use std::path::Path;
use std::sync::Arc;

use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, ServerName};
use rustls::{ClientConfig, RootCertStore};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio_rustls::client::TlsStream;
use tokio_rustls::TlsConnector;

/// How one engine's connections are secured: the trusted roots, and the name its certificate
/// must carry.
#[derive(Clone)]
pub struct Tls {
    connector: TlsConnector,
    name: ServerName<'static>,
}

impl std::fmt::Debug for Tls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tls")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

impl Tls {
    /// TLS to `host` (a DNS name or an IP address), trusting the system's roots and the
    /// certificates in `ca_file`. An unreadable CA file, or one with no certificate, is an error.
    pub fn new(host: &str, ca_file: Option<&Path>) -> Result<Self, String> {
        let mut roots = RootCertStore::empty();
        let native = rustls_native_certs::load_native_certs();
        let (added, _) = roots.add_parsable_certificates(native.certs);
        if let Some(path) = ca_file {
            let certs = CertificateDer::pem_file_iter(path)
                .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
                .map_err(|e| format!("ca_file {}: {e}", path.display()))?;
            if certs.is_empty() {
                return Err(format!(
                    "ca_file {}: no PEM certificate in it",
                    path.display()
                ));
            }
            let (ours, bad) = roots.add_parsable_certificates(certs);
            if ours == 0 {
                return Err(format!(
                    "ca_file {}: none of its {bad} certificates could be used",
                    path.display()
                ));
            }
        } else if added == 0 {
            tracing::warn!(%host, "no system root certificates found: the engine's certificate can only be verified against a ca_file");
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut config = ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| format!("TLS: {e}"))?
            .with_root_certificates(roots)
            .with_no_client_auth();
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        let name = ServerName::try_from(host.to_owned())
            .map_err(|e| format!("\"{host}\" cannot name a TLS server: {e}"))?;
        Ok(Self {
            connector: TlsConnector::from(Arc::new(config)),
            name,
        })
    }

    /// The TLS handshake on `stream`, verifying the engine's certificate.
    pub(super) async fn connect<S>(&self, stream: S) -> std::io::Result<TlsStream<S>>
    where
        S: AsyncRead + AsyncWrite + Unpin,
    {
        self.connector.connect(self.name.clone(), stream).await
    }
}
