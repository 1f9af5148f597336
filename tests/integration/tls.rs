//! TLS with rustls: the client listener (`[server.tls]`, its certificate renewed on disk without
//! a restart) and `https://` engines verified against `[server] upstream_ca_file` and shown the
//! gateway's own certificate (`upstream_identity`, mTLS). Certificates are made per test with
//! rcgen, for `localhost`.

use crate::support::{Gateway, MockEngine, TempFile, client};
use serde_json::json;
use std::net::SocketAddr;
use std::time::Duration;
use switchyard_tls::test_util::TestCa;

/// A self-signed certificate for `localhost`, as PEM: (certificate, key).
fn self_signed() -> (String, String) {
    let made = rcgen::generate_simple_self_signed(vec!["localhost".to_owned()]).unwrap();
    (made.cert.pem(), made.signing_key.serialize_pem())
}

/// Certificate and key files, in one temporary directory.
struct CertFiles {
    cert: TempFile,
    key: std::path::PathBuf,
    pem: String,
}

impl CertFiles {
    fn new() -> CertFiles {
        let (pem, key_pem) = self_signed();
        let cert = TempFile::new("tls.crt", &pem);
        let key = cert.path.with_file_name("tls.key");
        std::fs::write(&key, key_pem).unwrap();
        CertFiles { cert, key, pem }
    }

    /// A renewal: a new certificate and key written over the old files.
    fn renew(&mut self) {
        let (pem, key_pem) = self_signed();
        std::fs::write(&self.key, key_pem).unwrap();
        std::fs::write(&self.cert.path, &pem).unwrap();
        self.pem = pem;
    }

    fn toml(&self) -> String {
        format!(
            "[server.tls]\ncert_file = \"{}\"\nkey_file = \"{}\"\n",
            self.cert.path.display(),
            self.key.display()
        )
    }
}

/// A client that trusts `pem` alone and finds `localhost` at `addr`.
fn trusting(pem: &str, addr: SocketAddr) -> reqwest::Client {
    reqwest::Client::builder()
        .tls_built_in_root_certs(false)
        .add_root_certificate(reqwest::Certificate::from_pem(pem.as_bytes()).unwrap())
        .resolve("localhost", addr)
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap()
}

fn addr_of(url: &str) -> SocketAddr {
    url.rsplit("://").next().unwrap().parse().unwrap()
}

fn chat() -> serde_json::Value {
    json!({"model": "smollm2-135m-instruct", "max_tokens": 8,
        "messages": [{"role": "user", "content": "Hello over TLS"}]})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_client_listener_speaks_tls_only_and_takes_a_renewed_certificate() {
    let engine = MockEngine::start(50.0, 4096);
    let mut certs = CertFiles::new();
    let gateway = Gateway::start(&format!(
        "{}{}",
        certs.toml(),
        Gateway::config_for(&[&engine], "kv-cost")
    ));
    assert!(gateway.url.starts_with("https://"), "{}", gateway.url);
    let addr = addr_of(&gateway.url);
    let https = format!("https://localhost:{}", addr.port());
    let r = trusting(&certs.pem, addr)
        .post(format!("{https}/v1/chat/completions"))
        .json(&chat())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert!(r.text().await.unwrap().contains("\"finish_reason\""));
    // Plain HTTP on the TLS port gets no answer; nor does a client that does not trust it.
    let plain = client().get(format!("http://{addr}/health")).send().await;
    assert!(plain.is_err(), "{plain:?}");
    let stranger = trusting(&self_signed().0, addr)
        .get(format!("{https}/health"))
        .send()
        .await;
    assert!(stranger.is_err(), "{stranger:?}");

    // Renewed on disk (cert-manager rewriting a mounted Secret): new handshakes present it.
    let old = certs.pem.clone();
    certs.renew();
    let renewed = trusting(&certs.pem, addr)
        .get(format!("{https}/health"))
        .send()
        .await;
    assert_eq!(renewed.map(|r| r.status().as_u16()).ok(), Some(200));
    let outdated = trusting(&old, addr)
        .get(format!("{https}/health"))
        .send()
        .await;
    assert!(outdated.is_err(), "the old certificate is still served");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn https_engines_are_verified_against_the_upstream_ca_and_shown_the_gateways_certificate() {
    // The "engine" is a TLS gateway in front of a mock engine: an OpenAI-compatible server
    // that speaks only HTTPS and, like an engine behind mTLS, answers only clients its CA signed.
    let engine = MockEngine::start(50.0, 4096);
    let ca = TestCa::new("engines' CA");
    let ca_file = TempFile::new("ca.crt", &ca.pem());
    let dir = ca_file.path.parent().unwrap();
    let tls = ca.server(dir, &["localhost"], Some(ca_file.path.clone()));
    let tls_engine = Gateway::start(&format!(
        "[server.tls]\ncert_file = \"{}\"\nkey_file = \"{}\"\nclient_ca_file = \"{}\"\n{}",
        tls.cert_file.display(),
        tls.key_file.display(),
        ca_file.path.display(),
        Gateway::config_for(&[&engine], "kv-cost")
    ));
    let port = addr_of(&tls_engine.url).port();
    let gateway = ca.client(dir, "gateway");
    let front = |ca: bool, identity: bool| {
        let mut server = String::from("[server]\n");
        if ca {
            server += &format!("upstream_ca_file = \"{}\"\n", ca_file.path.display());
        }
        if identity {
            server += &format!(
                "upstream_identity = {{ cert_file = \"{}\", key_file = \"{}\" }}\n",
                gateway.cert_file.display(),
                gateway.key_file.display()
            );
        }
        Gateway::start(&format!(
            "{server}[[workers]]\nurl = \"https://localhost:{port}\"\nkind = \"openai\"\n"
        ))
    };
    // Without the CA the engine's certificate is refused: never a request sent in the clear
    // or to an unverified server. Without the gateway's own certificate the engine refuses it.
    for (ca, identity, answered) in [
        (true, true, true),
        (false, true, false),
        (true, false, false),
    ] {
        let front = front(ca, identity);
        let r = client()
            .post(format!("{}/v1/chat/completions", front.url))
            .json(&chat())
            .send()
            .await
            .unwrap();
        let (status, body) = (r.status().as_u16(), r.text().await.unwrap());
        let expected = if answered {
            status == 200 && body.contains("\"finish_reason\"")
        } else {
            status == 502 || status == 503
        };
        assert!(expected, "ca {ca}, identity {identity}: {status}: {body}");
    }
}
