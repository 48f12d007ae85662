//! TLS for every connection, optional: both sides present a certificate signed by the
//! cluster's CA and check the other's (docs/design/security.md). The key handshake of
//! [`crate::auth`] then runs inside TLS, bound to the session by its exported keying material,
//! so a handshake relayed into another TLS session does not verify.
//!
//! Every member certificate names [`SERVER_NAME`]: peers are reached by address, and what a
//! connection must prove is membership (a certificate of the cluster's CA), not a host name.

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;

/// The name every member certificate carries, and every client asks for.
pub const SERVER_NAME: &str = "weft";
/// The label of the keying material a connection's key handshake is bound to (RFC 5705).
const BINDING_LABEL: &[u8] = b"EXPORTER-weft-auth-binding";
/// Bytes of that keying material.
pub const BINDING_BYTES: usize = 32;

/// The files of a TLS setup: this process's certificate and key, and the cluster's CA.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TlsFiles {
    /// This process's certificate chain (PEM).
    pub cert: PathBuf,
    /// Its private key (PEM).
    pub key: PathBuf,
    /// The cluster's CA certificate (PEM): peers must present a certificate it signed.
    pub ca: PathBuf,
}

impl TlsFiles {
    /// The files `weft certgen DIR` writes in `dir`.
    pub fn in_dir(dir: &Path) -> TlsFiles {
        TlsFiles {
            cert: dir.join("cert.pem"),
            key: dir.join("cert.key"),
            ca: dir.join("ca.pem"),
        }
    }

    /// What a config's `tls_cert_file`, `tls_key_file` and `tls_ca_file` ask for: all three
    /// (TLS), or none (plain TCP).
    ///
    /// # Errors
    /// When only some are given, naming the missing ones.
    pub fn configured(
        cert: Option<&Path>,
        key: Option<&Path>,
        ca: Option<&Path>,
    ) -> Result<Option<TlsFiles>, String> {
        match (cert, key, ca) {
            (None, None, None) => Ok(None),
            (Some(cert), Some(key), Some(ca)) => Ok(Some(TlsFiles {
                cert: cert.to_path_buf(),
                key: key.to_path_buf(),
                ca: ca.to_path_buf(),
            })),
            _ => {
                let missing: Vec<&str> = [
                    (cert.is_none(), "tls_cert_file"),
                    (key.is_none(), "tls_key_file"),
                    (ca.is_none(), "tls_ca_file"),
                ]
                .into_iter()
                .filter_map(|(missing, name)| missing.then_some(name))
                .collect();
                Err(format!(
                    "TLS needs tls_cert_file, tls_key_file and tls_ca_file together: {} missing",
                    missing.join(" and ")
                ))
            }
        }
    }
}

/// A process's TLS setup, for the connections it makes and accepts.
#[derive(Clone)]
pub struct Tls {
    client: tokio_rustls::TlsConnector,
    server: tokio_rustls::TlsAcceptor,
}

impl std::fmt::Debug for Tls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Tls")
    }
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

impl Tls {
    /// Loads the certificate, key and CA of `files`.
    ///
    /// # Errors
    /// When a file cannot be read or holds no certificate or key, naming the file.
    pub fn load(files: &TlsFiles) -> Result<Tls, String> {
        let read_error = |file: &Path, what: &str, error: String| {
            format!("cannot read the {what} {}: {error}", file.display())
        };
        let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(&files.cert)
            .and_then(|certs| certs.collect())
            .map_err(|e| read_error(&files.cert, "certificate", e.to_string()))?;
        if chain.is_empty() {
            return Err(format!("{} holds no certificate", files.cert.display()));
        }
        let key = crate::auth::open_private(&files.key, "TLS private key").and_then(|file| {
            PrivateKeyDer::from_pem_reader(std::io::BufReader::new(file))
                .map_err(|e| read_error(&files.key, "private key", e.to_string()))
        })?;
        let mut roots = rustls::RootCertStore::empty();
        let cas: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(&files.ca)
            .and_then(|certs| certs.collect())
            .map_err(|e| read_error(&files.ca, "CA certificate", e.to_string()))?;
        for ca in cas {
            roots
                .add(ca)
                .map_err(|e| read_error(&files.ca, "CA certificate", e.to_string()))?;
        }
        if roots.is_empty() {
            return Err(format!("{} holds no CA certificate", files.ca.display()));
        }
        let roots = Arc::new(roots);
        let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
            Arc::clone(&roots),
            provider(),
        )
        .build()
        .map_err(|e| format!("cannot use the CA {}: {e}", files.ca.display()))?;
        let unusable = |e: rustls::Error| {
            format!(
                "certificate {} and key {}: {e}",
                files.cert.display(),
                files.key.display()
            )
        };
        let server = rustls::ServerConfig::builder_with_provider(provider())
            .with_protocol_versions(&[&rustls::version::TLS13])
            .map_err(|e| e.to_string())?
            .with_client_cert_verifier(verifier)
            .with_single_cert(chain.clone(), key.clone_key())
            .map_err(unusable)?;
        let client = rustls::ClientConfig::builder_with_provider(provider())
            .with_protocol_versions(&[&rustls::version::TLS13])
            .map_err(|e| e.to_string())?
            .with_root_certificates(roots)
            .with_client_auth_cert(chain, key)
            .map_err(unusable)?;
        Ok(Tls {
            client: tokio_rustls::TlsConnector::from(Arc::new(client)),
            server: tokio_rustls::TlsAcceptor::from(Arc::new(server)),
        })
    }

    /// Opens TLS on a connection this process made; returns the stream and its binding.
    ///
    /// # Errors
    /// The TLS failure: the peer's certificate is not the cluster CA's, or it speaks no TLS.
    pub(crate) async fn connect(
        &self,
        stream: TcpStream,
    ) -> std::io::Result<(tokio_rustls::TlsStream<TcpStream>, [u8; BINDING_BYTES])> {
        let name = ServerName::try_from(SERVER_NAME).expect("a valid DNS name");
        let stream = self.client.connect(name, stream).await?;
        let binding = stream
            .get_ref()
            .1
            .export_keying_material([0u8; BINDING_BYTES], BINDING_LABEL, None)
            .map_err(std::io::Error::other)?;
        Ok((stream.into(), binding))
    }

    /// Accepts TLS on a connection; returns the stream and its binding.
    ///
    /// # Errors
    /// The TLS failure: the peer presented no certificate of the cluster's CA.
    pub(crate) async fn accept(
        &self,
        stream: TcpStream,
    ) -> std::io::Result<(tokio_rustls::TlsStream<TcpStream>, [u8; BINDING_BYTES])> {
        let stream = self.server.accept(stream).await?;
        let binding = stream
            .get_ref()
            .1
            .export_keying_material([0u8; BINDING_BYTES], BINDING_LABEL, None)
            .map_err(std::io::Error::other)?;
        Ok((stream.into(), binding))
    }
}

/// A connection, plain or in TLS.
pub(crate) enum Stream {
    Tcp(TcpStream),
    Tls(Box<tokio_rustls::TlsStream<TcpStream>>),
}

/// The reading half of a [`Stream`].
pub(crate) type ReadHalf = Box<dyn AsyncRead + Send + Unpin>;
/// The writing half of a [`Stream`].
pub(crate) type WriteHalf = Box<dyn AsyncWrite + Send + Unpin>;

impl Stream {
    /// Halves a reader task and a writer task can own, and for plain TCP the writing half
    /// again, for callers that write to it directly when the writer task is idle
    /// ([`crate::outbox::Outbox`]).
    pub(crate) fn split(
        self,
    ) -> (
        ReadHalf,
        WriteHalf,
        Option<std::sync::Arc<tokio::net::tcp::OwnedWriteHalf>>,
    ) {
        match self {
            Stream::Tcp(stream) => {
                let (reader, writer) = stream.into_split();
                let writer = std::sync::Arc::new(writer);
                let shared = crate::outbox::SharedTcp(std::sync::Arc::clone(&writer));
                (Box::new(reader), Box::new(shared), Some(writer))
            }
            Stream::Tls(stream) => {
                let (reader, writer) = tokio::io::split(*stream);
                (Box::new(reader), Box::new(writer), None)
            }
        }
    }
}

/// Writes a new CA and a member certificate signed by it into `dir` (`ca.pem`, `ca.key`,
/// `cert.pem`, `cert.key`; keys with mode 0600); existing files are never overwritten.
///
/// # Errors
/// When a file exists or cannot be written, naming it.
pub fn write_new_ca(dir: &Path) -> Result<TlsFiles, String> {
    use rcgen::{
        BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair,
        KeyUsagePurpose,
    };
    let generated = |error: rcgen::Error| format!("cannot make a certificate: {error}");
    let files = TlsFiles::in_dir(dir);
    let ca_key_file = dir.join("ca.key");
    for file in [&files.ca, &ca_key_file, &files.cert, &files.key] {
        if file.exists() {
            return Err(format!(
                "{} exists: certificates are never overwritten (remove them first to replace them)",
                file.display()
            ));
        }
    }
    std::fs::create_dir_all(dir)
        .map_err(|error| format!("cannot create {}: {error}", dir.display()))?;

    let ca_key = KeyPair::generate().map_err(generated)?;
    let mut ca_params = CertificateParams::new(Vec::new()).map_err(generated)?;
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(DnType::CommonName, "Weft cluster CA");
    ca_params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    let ca = ca_params.self_signed(&ca_key).map_err(generated)?;

    let key = KeyPair::generate().map_err(generated)?;
    let mut params = CertificateParams::new(vec![SERVER_NAME.to_string()]).map_err(generated)?;
    params
        .distinguished_name
        .push(DnType::CommonName, "Weft cluster member");
    params.extended_key_usages = vec![
        ExtendedKeyUsagePurpose::ServerAuth,
        ExtendedKeyUsagePurpose::ClientAuth,
    ];
    let cert = params.signed_by(&key, &ca, &ca_key).map_err(generated)?;

    write_file(&files.ca, ca.pem().as_bytes(), 0o644)?;
    write_file(&ca_key_file, ca_key.serialize_pem().as_bytes(), 0o600)?;
    write_file(&files.cert, cert.pem().as_bytes(), 0o644)?;
    write_file(&files.key, key.serialize_pem().as_bytes(), 0o600)?;
    Ok(files)
}

fn write_file(file: &Path, bytes: &[u8], mode: u32) -> Result<(), String> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(file)
        .and_then(|mut out| {
            out.write_all(bytes)?;
            out.sync_all()
        })
        .map_err(|error| format!("cannot write {}: {error}", file.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    // Goal: two holders of certificates of one CA open TLS both ways and agree on the binding;
    // a peer with a certificate of another CA is refused by either side.
    #[tokio::test]
    async fn only_certificates_of_the_cluster_ca_connect() {
        let directory = tempfile::tempdir().expect("tempdir");
        let ours =
            Tls::load(&write_new_ca(&directory.path().join("ours")).expect("ca")).expect("load");
        let theirs =
            Tls::load(&write_new_ca(&directory.path().join("theirs")).expect("ca")).expect("load");
        let pair = |server: Tls, client: Tls| async move {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
                .await
                .expect("bind");
            let address = listener.local_addr().expect("address");
            let accepting = tokio::spawn(async move {
                let (stream, _) = listener.accept().await.expect("accept");
                server.accept(stream).await.map(|(_, binding)| binding)
            });
            let stream = TcpStream::connect(address).await.expect("connect");
            let connected = client.connect(stream).await.map(|(_, binding)| binding);
            (accepting.await.expect("task"), connected)
        };
        let (accepted, connected) = pair(ours.clone(), ours.clone()).await;
        let (accepted, connected) = (accepted.expect("accept"), connected.expect("connect"));
        assert_eq!(accepted, connected, "both sides export the same binding");
        let (_, connected) = pair(theirs.clone(), ours.clone()).await;
        assert!(connected.is_err(), "a server of another CA is refused");
        let (accepted, _) = pair(ours, theirs).await;
        assert!(accepted.is_err(), "a client of another CA is refused");
        let error = write_new_ca(&directory.path().join("ours")).expect_err("exists");
        assert!(error.contains("never overwritten"), "{error}");
    }
}
