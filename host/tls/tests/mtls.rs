//! Mutual TLS on a [`TlsListener`]: with `client_ca_file`, only clients whose certificate that
//! CA signed get an answer. Certificates are made per test with rcgen.

#![allow(clippy::unwrap_used, reason = "a test fails by panicking")]

use std::path::Path;
use std::time::Duration;

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, ExtendedKeyUsagePurpose, IsCa, KeyPair,
    KeyUsagePurpose,
};
use switchyard_tls::{ServerTls, TlsListener};

/// A CA that signs certificates.
struct Ca(CertifiedIssuer<'static, KeyPair>);

impl Ca {
    fn new(name: &str) -> Ca {
        let mut params = CertificateParams::new(Vec::new()).unwrap();
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, name);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        Ca(CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap())
    }

    /// A certificate for `names` with `usage`, as PEM: (certificate, key).
    fn sign(&self, names: &[&str], usage: ExtendedKeyUsagePurpose) -> (String, String) {
        let names: Vec<String> = names.iter().map(|n| (*n).to_owned()).collect();
        let mut params = CertificateParams::new(names).unwrap();
        params.extended_key_usages = vec![usage];
        let key = KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &self.0).unwrap();
        (cert.pem(), key.serialize_pem())
    }
}

fn write(dir: &Path, name: &str, contents: &str) -> std::path::PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, contents).unwrap();
    path
}

/// A `localhost` certificate `ca` signed, written to `dir`, with `client_ca_file`.
fn server_files(dir: &Path, ca: &Ca, client_ca_file: Option<std::path::PathBuf>) -> ServerTls {
    let (cert, key) = ca.sign(&["localhost"], ExtendedKeyUsagePurpose::ServerAuth);
    ServerTls {
        cert_file: write(dir, "tls.crt", &cert),
        key_file: write(dir, "tls.key", &key),
        client_ca_file,
    }
}

/// Serves "ok" over TLS with `config` on 127.0.0.1; the URL to reach it as `localhost`.
async fn serve(config: &ServerTls) -> (String, std::net::SocketAddr) {
    let tcp = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = tcp.local_addr().unwrap();
    let listener = TlsListener::new(tcp, config).unwrap();
    let app = axum::Router::new().route("/", axum::routing::get(|| async { "ok" }));
    tokio::spawn(async move { axum::serve(listener, app).await });
    (format!("https://localhost:{}/", addr.port()), addr)
}

fn client(
    ca_pem: &str,
    addr: std::net::SocketAddr,
    identity: Option<(String, String)>,
) -> reqwest::Client {
    let mut builder = reqwest::Client::builder()
        .tls_built_in_root_certs(false)
        .add_root_certificate(reqwest::Certificate::from_pem(ca_pem.as_bytes()).unwrap())
        .resolve("localhost", addr)
        .timeout(Duration::from_secs(20));
    if let Some((cert, key)) = identity {
        let pem = format!("{cert}{key}");
        builder = builder.identity(reqwest::Identity::from_pem(pem.as_bytes()).unwrap());
    }
    builder.build().unwrap()
}

#[tokio::test]
async fn with_a_client_ca_only_clients_that_ca_signed_are_answered() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new("switchyard test CA");
    let client_ca = write(dir.path(), "ca.crt", &ca.0.pem());
    let config = server_files(dir.path(), &ca, Some(client_ca));
    let (url, addr) = serve(&config).await;
    let ca_pem = ca.0.pem();

    let signed = ca.sign(&["gateway"], ExtendedKeyUsagePurpose::ClientAuth);
    let answered = client(&ca_pem, addr, Some(signed)).get(&url).send().await;
    assert_eq!(answered.unwrap().text().await.unwrap(), "ok");

    let anonymous = client(&ca_pem, addr, None).get(&url).send().await;
    assert!(anonymous.is_err(), "no client certificate: {anonymous:?}");
    let other_ca = Ca::new("someone else's CA");
    let stranger = other_ca.sign(&["gateway"], ExtendedKeyUsagePurpose::ClientAuth);
    let refused = client(&ca_pem, addr, Some(stranger)).get(&url).send().await;
    assert!(refused.is_err(), "a certificate of another CA: {refused:?}");
}

#[tokio::test]
async fn without_a_client_ca_no_client_certificate_is_asked_for() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new("switchyard test CA");
    let config = server_files(dir.path(), &ca, None);
    let (url, addr) = serve(&config).await;
    let answered = client(&ca.0.pem(), addr, None).get(&url).send().await;
    assert_eq!(answered.unwrap().text().await.unwrap(), "ok");
}

#[test]
fn a_client_ca_file_without_certificates_fails_at_start_and_names_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new("switchyard test CA");
    let empty = write(dir.path(), "empty.crt", "not a certificate\n");
    let config = server_files(dir.path(), &ca, Some(empty.clone()));
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let error = runtime.block_on(async {
        let tcp = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        TlsListener::new(tcp, &config).unwrap_err()
    });
    let message = error.to_string();
    assert!(
        message.contains("client_ca_file") && message.contains(&empty.display().to_string()),
        "{message}"
    );
}
