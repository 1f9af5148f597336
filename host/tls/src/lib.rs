//! TLS for Switchyard's listeners and clients, with rustls (ring), shared by the gateway's
//! client listener and the shared KV pool's.
//!
//! - [`TlsListener`]: an `axum::serve::Listener` whose connections have finished their
//!   handshake; the certificate is read again when its files change on disk, and with
//!   `client_ca_file` every client must present a certificate that CA signed (mTLS).
//! - [`ClientTls`]: an HTTPS client (reqwest) that also trusts a private CA and presents a
//!   certificate of its own to servers that ask for one (mTLS to engines and pools).

#[cfg(feature = "listener")]
mod listener;
#[cfg(feature = "test-util")]
pub mod test_util;

use std::path::{Path, PathBuf};

use serde::Deserialize;

#[cfg(feature = "listener")]
pub use listener::TlsListener;

/// A TLS listener's files (`[server.tls]`, `switchyard kv-pool --tls-*`).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServerTls {
    /// PEM certificate chain, the server's own certificate first.
    pub cert_file: PathBuf,
    /// PEM private key (PKCS#8, PKCS#1 or SEC1).
    pub key_file: PathBuf,
    /// PEM CA certificates: when set, a client must present a certificate one of them signed
    /// (mutual TLS); read at start. Default: no client certificate asked for.
    #[serde(default)]
    pub client_ca_file: Option<PathBuf>,
}

/// Why a certificate, key or CA file could not be used (the message names the file).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct TlsError(String);

/// How a client (the gateway towards engines, an engine towards the pool) speaks TLS beyond the
/// system's roots.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClientTls {
    /// PEM CA certificates also trusted (servers whose certificates a private CA signed).
    pub ca_file: Option<PathBuf>,
    /// The client's own certificate, for servers that ask for one (mutual TLS).
    pub identity: Option<ClientIdentity>,
}

/// A client certificate and its key, PEM files (`[server.upstream_identity]`).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClientIdentity {
    /// PEM certificate chain, the client's own certificate first.
    pub cert_file: PathBuf,
    /// PEM private key (PKCS#8, PKCS#1 or SEC1).
    pub key_file: PathBuf,
}

impl ClientTls {
    /// `builder` trusting `ca_file` beside the system's roots and presenting `identity`; the
    /// files are read now, and an error names the one that could not be used.
    pub fn apply(
        &self,
        mut builder: reqwest::ClientBuilder,
    ) -> Result<reqwest::ClientBuilder, TlsError> {
        if let Some(path) = &self.ca_file {
            builder = trust_ca_file(builder, path)?;
        }
        if let Some(identity) = &self.identity {
            builder = builder.identity(identity.load()?);
        }
        Ok(builder)
    }
}

impl ClientIdentity {
    fn load(&self) -> Result<reqwest::Identity, TlsError> {
        let read = |path: &Path| {
            std::fs::read(path).map_err(|e| TlsError(format!("{}: {e}", path.display())))
        };
        // reqwest wants the chain and the key in one PEM buffer.
        let mut pem = read(&self.cert_file)?;
        pem.push(b'\n');
        pem.extend(read(&self.key_file)?);
        reqwest::Identity::from_pem(&pem).map_err(|e| {
            TlsError(format!(
                "{} with {}: {e}",
                self.cert_file.display(),
                self.key_file.display()
            ))
        })
    }
}

/// `builder`, also trusting the CA certificates in the PEM file at `path` (beside the system's
/// roots): for servers whose certificates a private CA signed.
fn trust_ca_file(
    mut builder: reqwest::ClientBuilder,
    path: &Path,
) -> Result<reqwest::ClientBuilder, TlsError> {
    let failed = |reason: String| TlsError(format!("{}: {reason}", path.display()));
    let pem = std::fs::read(path).map_err(|e| failed(e.to_string()))?;
    let certs = reqwest::Certificate::from_pem_bundle(&pem).map_err(|e| failed(e.to_string()))?;
    if certs.is_empty() {
        return Err(failed("no PEM certificate in it".into()));
    }
    for cert in certs {
        builder = builder.add_root_certificate(cert);
    }
    Ok(builder)
}

/// The PEM certificates in `path`, at least one (`field` names the setting in errors).
#[cfg(feature = "listener")]
fn pem_certificates(
    path: &Path,
    field: &str,
) -> Result<Vec<rustls::pki_types::CertificateDer<'static>>, TlsError> {
    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::pem::PemObject;
    let certs = CertificateDer::pem_file_iter(path)
        .and_then(Iterator::collect::<Result<Vec<_>, _>>)
        .map_err(|e| TlsError(format!("{field} {}: {e}", path.display())))?;
    if certs.is_empty() {
        return Err(TlsError(format!(
            "{field} {}: no PEM certificate in it",
            path.display()
        )));
    }
    Ok(certs)
}
