//! A TLS listener for axum.
//!
//! Handshakes run in their own tasks (bounded in time), so a client that opens a connection and
//! never finishes its hello holds nothing but that task; finished connections are handed to
//! axum through [`TlsListener`]. The certificate and key are read again when either file
//! changes on disk (cert-manager renewing a mounted Secret), checked on each handshake; a
//! renewal that does not load keeps the certificate in force and says why.

use std::fmt;
use std::io;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use rustls::pki_types::PrivateKeyDer;
use rustls::pki_types::pem::PemObject;
use rustls::server::{ClientHello, ResolvesServerCert, WebPkiClientVerifier};
use rustls::sign::CertifiedKey;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;

use crate::{ServerTls, TlsError, pem_certificates};

/// Longest a client may take to finish its TLS handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Handshaken connections waiting for axum to take them.
const ACCEPTED_BACKLOG: usize = 256;

/// A listener whose connections have finished their TLS handshake.
#[derive(Debug)]
pub struct TlsListener {
    accepted: mpsc::Receiver<(TlsStream<TcpStream>, SocketAddr)>,
    local: SocketAddr,
}

impl TlsListener {
    /// Serves TLS on `tcp` with the files `config` names (read now: a bad file fails here, at
    /// start).
    pub fn new(tcp: TcpListener, config: &ServerTls) -> Result<Self, TlsError> {
        let local = tcp
            .local_addr()
            .map_err(|e| TlsError(format!("listener: {e}")))?;
        let certs = CertFiles::load(&config.cert_file, &config.key_file)?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| TlsError(e.to_string()))?;
        let builder = match &config.client_ca_file {
            None => builder.with_no_client_auth(),
            Some(path) => {
                let mut roots = rustls::RootCertStore::empty();
                for cert in pem_certificates(path, "client_ca_file")? {
                    roots
                        .add(cert)
                        .map_err(|e| TlsError(format!("client_ca_file {}: {e}", path.display())))?;
                }
                let verifier = WebPkiClientVerifier::builder_with_provider(roots.into(), provider)
                    .build()
                    .map_err(|e| TlsError(format!("client_ca_file {}: {e}", path.display())))?;
                builder.with_client_cert_verifier(verifier)
            }
        };
        let mut server = builder.with_cert_resolver(Arc::new(certs));
        server.alpn_protocols = vec![b"http/1.1".to_vec()];
        let acceptor = TlsAcceptor::from(Arc::new(server));
        let (tx, accepted) = mpsc::channel(ACCEPTED_BACKLOG);
        tokio::spawn(accept_loop(tcp, acceptor, tx));
        Ok(Self { accepted, local })
    }
}

impl axum::serve::Listener for TlsListener {
    type Io = TlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.accepted.recv().await {
            Some(connection) => connection,
            // The accept loop only ends when this listener is dropped.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> io::Result<Self::Addr> {
        Ok(self.local)
    }
}

/// Accepts TCP connections and handshakes each in its own task, until the listener is dropped.
async fn accept_loop(
    tcp: TcpListener,
    acceptor: TlsAcceptor,
    tx: mpsc::Sender<(TlsStream<TcpStream>, SocketAddr)>,
) {
    loop {
        let (stream, peer) = tokio::select! {
            accepted = tcp.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    // Out of file descriptors and the like: wait, as axum's own loop does.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = tx.closed() => return,
        };
        // Token-sized SSE writes must not wait for delayed ACKs (Nagle's algorithm).
        let _ = stream.set_nodelay(true);
        let (acceptor, tx) = (acceptor.clone(), tx.clone());
        tokio::spawn(async move {
            match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await {
                Ok(Ok(tls)) => {
                    let _ = tx.send((tls, peer)).await;
                }
                Ok(Err(e)) => tracing::debug!(%peer, error = %e, "TLS handshake failed"),
                Err(_) => tracing::debug!(%peer, "TLS handshake timed out"),
            }
        });
    }
}

/// The certificate chain and key files, read again when either changes.
struct CertFiles {
    cert: PathBuf,
    key: PathBuf,
    loaded: Mutex<Loaded>,
}

struct Loaded {
    stamps: (Option<SystemTime>, Option<SystemTime>),
    key: Arc<CertifiedKey>,
}

impl CertFiles {
    fn load(cert: &Path, key: &Path) -> Result<Self, TlsError> {
        let stamps = (modified(cert), modified(key));
        let loaded = Loaded {
            stamps,
            key: Arc::new(certified_key(cert, key)?),
        };
        Ok(Self {
            cert: cert.to_owned(),
            key: key.to_owned(),
            loaded: Mutex::new(loaded),
        })
    }

    /// The key in force, first read again if a file changed since it was read.
    fn current(&self) -> Arc<CertifiedKey> {
        let mut loaded = self.loaded.lock().unwrap_or_else(|e| e.into_inner());
        let stamps = (modified(&self.cert), modified(&self.key));
        if stamps != loaded.stamps {
            // Whatever happens, not again until the files change once more.
            loaded.stamps = stamps;
            match certified_key(&self.cert, &self.key) {
                Ok(key) => {
                    tracing::info!(cert = %self.cert.display(), "TLS certificate reloaded");
                    loaded.key = Arc::new(key);
                }
                Err(e) => tracing::warn!(error = %e, "keeping the TLS certificate in force"),
            }
        }
        loaded.key.clone()
    }
}

impl ResolvesServerCert for CertFiles {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current())
    }
}

impl fmt::Debug for CertFiles {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CertFiles")
            .field("cert", &self.cert)
            .field("key", &self.key)
            .finish_non_exhaustive()
    }
}

fn modified(path: &Path) -> Option<SystemTime> {
    std::fs::metadata(path).and_then(|m| m.modified()).ok()
}

/// Reads a PEM certificate chain and its private key (PKCS#8, PKCS#1 or SEC1), and checks
/// that they belong together.
fn certified_key(cert: &Path, key: &Path) -> Result<CertifiedKey, TlsError> {
    let chain = pem_certificates(cert, "cert_file")?;
    let der = PrivateKeyDer::from_pem_file(key)
        .map_err(|e| TlsError(format!("key_file {}: {e}", key.display())))?;
    let provider = rustls::crypto::ring::default_provider();
    let certified = CertifiedKey::from_der(chain, der, &provider)
        .map_err(|e| TlsError(format!("{} with {}: {e}", cert.display(), key.display())))?;
    Ok(certified)
}
