//! Certificates for tests (feature `test-util`), made with rcgen: a private CA that signs
//! server and client certificates, written as the PEM files the settings name.

#![allow(
    clippy::expect_used,
    reason = "test certificates: a failure is the test's"
)]

use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose,
};

use crate::{ClientIdentity, ServerTls};

/// A CA that signs certificates.
#[derive(Debug)]
pub struct TestCa(CertifiedIssuer<'static, KeyPair>);

impl TestCa {
    /// A new self-signed CA called `name`.
    pub fn new(name: &str) -> TestCa {
        let mut params = CertificateParams::new(Vec::new()).expect("CA parameters");
        params.distinguished_name.push(DnType::CommonName, name);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let key = KeyPair::generate().expect("CA key");
        TestCa(CertifiedIssuer::self_signed(params, key).expect("CA certificate"))
    }

    /// The CA's certificate (PEM).
    pub fn pem(&self) -> String {
        self.0.pem()
    }

    /// The CA's certificate written to `dir/name`.
    pub fn write(&self, dir: &Path, name: &str) -> PathBuf {
        write(dir, name, &self.pem())
    }

    /// A certificate for `names` with `usage`, as PEM: (certificate, key).
    pub fn sign(&self, names: &[&str], usage: ExtendedKeyUsagePurpose) -> (String, String) {
        let names: Vec<String> = names.iter().map(|n| (*n).to_owned()).collect();
        let mut params = CertificateParams::new(names).expect("certificate parameters");
        params.extended_key_usages = vec![usage];
        let key = KeyPair::generate().expect("key");
        let cert = params.signed_by(&key, &self.0).expect("signed certificate");
        (cert.pem(), key.serialize_pem())
    }

    /// A server certificate for `names` (`localhost`, `127.0.0.1`) written to `dir` as
    /// `server.crt`/`server.key`, asking clients for a certificate when `client_ca_file` is set.
    pub fn server(&self, dir: &Path, names: &[&str], client_ca_file: Option<PathBuf>) -> ServerTls {
        let (cert, key) = self.sign(names, ExtendedKeyUsagePurpose::ServerAuth);
        ServerTls {
            cert_file: write(dir, "server.crt", &cert),
            key_file: write(dir, "server.key", &key),
            client_ca_file,
        }
    }

    /// A client certificate for `name` written to `dir` as `<name>.crt`/`<name>.key`.
    pub fn client(&self, dir: &Path, name: &str) -> ClientIdentity {
        let (cert, key) = self.sign(&[name], ExtendedKeyUsagePurpose::ClientAuth);
        ClientIdentity {
            cert_file: write(dir, &format!("{name}.crt"), &cert),
            key_file: write(dir, &format!("{name}.key"), &key),
        }
    }
}

fn write(dir: &Path, name: &str, contents: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, contents).expect("write a test certificate");
    path
}
