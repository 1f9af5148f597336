//! Mutual TLS on a [`TlsListener`]: with `client_ca_file`, only clients whose certificate that
//! CA signed get an answer. Certificates are made per test with rcgen.

#![allow(clippy::unwrap_used, reason = "a test fails by panicking")]

use std::time::Duration;

use switchyard_tls::test_util::TestCa;
use switchyard_tls::{ClientIdentity, ClientTls, ServerTls, TlsListener};

/// Serves "ok" over TLS with `config` on 127.0.0.1; the URL to reach it as `localhost`.
async fn serve(config: &ServerTls) -> (String, std::net::SocketAddr) {
    let tcp = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = tcp.local_addr().unwrap();
    let listener = TlsListener::new(tcp, config).unwrap();
    let app = axum::Router::new().route("/", axum::routing::get(|| async { "ok" }));
    tokio::spawn(async move { axum::serve(listener, app).await });
    (format!("https://localhost:{}/", addr.port()), addr)
}

/// A client trusting the CA in `ca_file`, presenting `identity`, through [`ClientTls`] (the
/// gateway's and the engines' way).
fn client(
    ca_file: &std::path::Path,
    addr: std::net::SocketAddr,
    identity: Option<ClientIdentity>,
) -> reqwest::Client {
    let tls = ClientTls {
        ca_file: Some(ca_file.to_owned()),
        identity,
    };
    let builder = reqwest::Client::builder()
        .tls_built_in_root_certs(false)
        .resolve("localhost", addr)
        .timeout(Duration::from_secs(20));
    tls.apply(builder).unwrap().build().unwrap()
}

#[tokio::test]
async fn with_a_client_ca_only_clients_that_ca_signed_are_answered() {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new("switchyard test CA");
    let ca_file = ca.write(dir.path(), "ca.crt");
    let config = ca.server(dir.path(), &["localhost"], Some(ca_file.clone()));
    let (url, addr) = serve(&config).await;

    let signed = ca.client(dir.path(), "gateway");
    let answered = client(&ca_file, addr, Some(signed)).get(&url).send().await;
    assert_eq!(answered.unwrap().text().await.unwrap(), "ok");

    let anonymous = client(&ca_file, addr, None).get(&url).send().await;
    assert!(anonymous.is_err(), "no client certificate: {anonymous:?}");
    let stranger_dir = tempfile::tempdir().unwrap();
    let stranger = TestCa::new("someone else's CA").client(stranger_dir.path(), "gateway");
    let refused = client(&ca_file, addr, Some(stranger))
        .get(&url)
        .send()
        .await;
    assert!(refused.is_err(), "a certificate of another CA: {refused:?}");
}

#[tokio::test]
async fn without_a_client_ca_no_client_certificate_is_asked_for() {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new("switchyard test CA");
    let ca_file = ca.write(dir.path(), "ca.crt");
    let config = ca.server(dir.path(), &["localhost"], None);
    let (url, addr) = serve(&config).await;
    let answered = client(&ca_file, addr, None).get(&url).send().await;
    assert_eq!(answered.unwrap().text().await.unwrap(), "ok");
}

#[test]
fn a_client_certificate_that_cannot_be_used_names_its_file() {
    let dir = tempfile::tempdir().unwrap();
    let mut identity = TestCa::new("switchyard test CA").client(dir.path(), "gateway");
    identity.key_file = dir.path().join("missing.key");
    let tls = ClientTls {
        ca_file: None,
        identity: Some(identity),
    };
    let message = tls
        .apply(reqwest::Client::builder())
        .unwrap_err()
        .to_string();
    assert!(message.contains("missing.key"), "{message}");
    let ca_file = dir.path().join("empty.crt");
    std::fs::write(&ca_file, "not a certificate\n").unwrap();
    let tls = ClientTls {
        ca_file: Some(ca_file),
        identity: None,
    };
    let message = tls
        .apply(reqwest::Client::builder())
        .unwrap_err()
        .to_string();
    assert!(message.contains("empty.crt"), "{message}");
}

#[test]
fn a_client_ca_file_without_certificates_fails_at_start_and_names_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new("switchyard test CA");
    let empty = dir.path().join("empty.crt");
    std::fs::write(&empty, "not a certificate\n").unwrap();
    let config = ca.server(dir.path(), &["localhost"], Some(empty.clone()));
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
