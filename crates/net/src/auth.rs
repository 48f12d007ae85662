//! Who may connect: the cluster key, and the handshake every connection runs before its first
//! frame (docs/design/security.md).
//!
//! Both sides prove they hold the key without sending it: each answers the other's fresh
//! nonce with an HMAC-SHA256 over both nonces, the protocol version, the client's name and a
//! label naming its direction, so a recorded handshake cannot be replayed and a proof cannot
//! be reflected back to its maker. The client checks the server's proof before it sends its
//! own. Proofs are compared in constant time (`ring::hmac::verify`).
//!
//! ```text
//! client → server  HELLO      "WFTA", lowest and highest version (u16 each), flags (1: holds
//!                             a key), name length (u8), name, Nc (32 bytes)
//! server → client  CHALLENGE  tag 1, version (u16), Ns (32 bytes), Ps (32 bytes)
//!               or OPEN       tag 2, version (u16): the server runs without authentication
//!               or REFUSED    tag 0, reason (u8), the server's lowest and highest version
//! client → server  PROOF      tag 3, Pc (32 bytes)
//! server → client  WELCOME    tag 4, or REFUSED
//!
//! Ps = HMAC(K, "weft server" | version | name | Nc | Ns | binding)
//! Pc = HMAC(K, "weft client" | version | name | Ns | Nc | binding)
//! ```
//!
//! Integers are little endian; `binding` is empty over plain TCP and the TLS session's
//! exported keying material inside TLS ([`crate::tls`]). `name` is empty for the cluster's
//! members, whose `K` is the cluster key; a client identity sends its name, and its `K` is its
//! client key, `HMAC(cluster key, "weft client key" | name)`: the servers derive it from the
//! name, so no list of client keys is kept, and a client key proves nothing else.

use crate::tls::{Tls, TlsFiles};
use ring::hmac;
use ring::rand::{SecureRandom, SystemRandom};
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use weft_proto::codec::{PROTOCOL_VERSION, PROTOCOL_VERSION_MIN};

/// The first four bytes of every Weft connection.
pub const HANDSHAKE_MAGIC: [u8; 4] = *b"WFTA";
/// Longest a handshake may take, on either side.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);
/// The protocol versions this build speaks: the oldest and the newest.
pub const VERSIONS_SPOKEN: (u16, u16) = (PROTOCOL_VERSION_MIN, PROTOCOL_VERSION);
/// Bytes of a cluster key.
pub const KEY_BYTES: usize = 32;
/// Where a host keeps its cluster key when nothing else names one.
pub const SYSTEM_KEY_FILE: &str = "/etc/weft/cluster.key";

const NONCE_BYTES: usize = 32;
const PROOF_BYTES: usize = 32;
const FLAG_HOLDS_KEY: u8 = 1;
const NAME_BYTES_MAX: usize = 64;

const TAG_REFUSED: u8 = 0;
const TAG_CHALLENGE: u8 = 1;
const TAG_OPEN: u8 = 2;
const TAG_PROOF: u8 = 3;
const TAG_WELCOME: u8 = 4;

/// The `auth` config key: the only value is `"none"`, which runs without authentication.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum AuthMode {
    /// No authentication: any peer that reaches the port can read and change everything.
    None,
}

/// The security keys of every service and client config, as given.
#[derive(Clone, Copy, Debug, Default)]
pub struct AuthSettings<'a> {
    /// `auth`.
    pub mode: Option<AuthMode>,
    /// `auth_key_file`.
    pub key_file: Option<&'a Path>,
    /// `tls_cert_file`.
    pub tls_cert_file: Option<&'a Path>,
    /// `tls_key_file`.
    pub tls_key_file: Option<&'a Path>,
    /// `tls_ca_file`.
    pub tls_ca_file: Option<&'a Path>,
}

/// What a process proves itself with, on the connections it makes and accepts: the cluster
/// key, and TLS when configured.
#[derive(Clone, Default)]
pub struct Auth {
    key: Option<Arc<ClusterKey>>,
    tls: Option<Tls>,
}

/// Who is at the other end of a connection a server accepted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Identity {
    /// A holder of the cluster key: a server, an admin tool, a trusted mount; or anyone, on a
    /// service that runs without authentication.
    Member,
    /// A holder of the client key issued for this name (`weft keygen --client NAME`).
    Client(Arc<str>),
}

impl fmt::Display for Identity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Identity::Member => f.write_str("member"),
            Identity::Client(name) => write!(f, "client {name}"),
        }
    }
}

struct ClusterKey {
    key: hmac::Key,
    file: PathBuf,
    /// The client's name, for a client key; `None` for the cluster key.
    client: Option<String>,
}

/// What a client key is derived with, before the client's name.
const CLIENT_KEY_LABEL: &[u8] = b"weft client key";

/// What the client key of `name` is the HMAC of, under the cluster key.
fn client_key_input(name: &[u8]) -> Vec<u8> {
    let mut input = CLIENT_KEY_LABEL.to_vec();
    input.extend_from_slice(name);
    input
}

/// The client key of `name`, from the cluster key.
fn client_key(cluster: &hmac::Key, name: &[u8]) -> hmac::Key {
    derive(cluster, &client_key_input(name))
}

/// A key derived from `key` for `input`: the HMAC of `input` under `key`.
fn derive(key: &hmac::Key, input: &[u8]) -> hmac::Key {
    hmac::Key::new(hmac::HMAC_SHA256, hmac::sign(key, input).as_ref())
}

impl fmt::Debug for Auth {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.key {
            Some(key) => write!(f, "Auth(key in {}", key.file.display())?,
            None => f.write_str("Auth(no key")?,
        }
        f.write_str(if self.tls.is_some() { ", TLS)" } else { ")" })
    }
}

impl Auth {
    /// No authentication.
    pub fn none() -> Auth {
        Auth::default()
    }

    /// This, over TLS with `files` when given.
    ///
    /// # Errors
    /// When the certificate, key or CA cannot be used, naming the file.
    pub fn with_tls(mut self, files: Option<&TlsFiles>) -> Result<Auth, String> {
        self.tls = files.map(Tls::load).transpose()?;
        Ok(self)
    }

    /// The TLS setup, when connections use TLS.
    pub fn tls(&self) -> Option<&Tls> {
        self.tls.as_ref()
    }

    /// The cluster key held in `file` (`weft keygen`).
    ///
    /// # Errors
    /// When the file cannot be read, can be read by group or others, or does not hold a key;
    /// the message names the file and the fix.
    pub fn from_key_file(file: &Path) -> Result<Auth, String> {
        let (client, bytes) = read_key_file(file)?;
        Ok(Auth {
            key: Some(Arc::new(ClusterKey {
                key: hmac::Key::new(hmac::HMAC_SHA256, &bytes),
                file: file.to_path_buf(),
                client,
            })),
            tls: None,
        })
    }

    /// The client name of a client key; `None` for the cluster key or no key.
    pub fn client_name(&self) -> Option<&str> {
        self.key.as_ref().and_then(|key| key.client.as_deref())
    }

    /// A key derived from the cluster key for `label`; `None` without the cluster key (no key,
    /// or a client's).
    pub(crate) fn derived_key(&self, label: &[u8]) -> Option<hmac::Key> {
        let key = self.key.as_ref().filter(|key| key.client.is_none())?;
        Some(derive(&key.key, label))
    }

    /// A service's: what [`Auth::from_settings`] gives, refused when it is a client key.
    ///
    /// # Errors
    /// As [`Auth::from_settings`], or when the key file holds a client key.
    pub fn for_service(settings: AuthSettings<'_>) -> Result<Auth, String> {
        let auth = Auth::from_settings(settings)?;
        match (auth.client_name(), auth.key_file()) {
            (Some(name), Some(file)) => Err(format!(
                "{} holds the client key of {name:?}: a service needs the cluster key",
                file.display()
            )),
            _ => Ok(auth),
        }
    }

    /// What a config's `auth` and `auth_key_file` keys ask for. Running without authentication
    /// must be asked for; it is logged as a warning every time.
    ///
    /// # Errors
    /// When neither or both are set, or the key file is unusable; the message names the keys.
    pub fn configured(mode: Option<AuthMode>, key_file: Option<&Path>) -> Result<Auth, String> {
        match (mode, key_file) {
            (Some(AuthMode::None), Some(_)) => Err(
                "auth = \"none\" and auth_key_file are both set: remove one of them".to_string(),
            ),
            (Some(AuthMode::None), None) => {
                tracing::warn!(
                    "running without authentication (auth = \"none\"): connections neither prove \
                     nor check membership of the cluster, and a service lets any peer that reaches \
                     its port read and change everything; give auth_key_file instead"
                );
                Ok(Auth::none())
            }
            (None, Some(file)) => Auth::from_key_file(file),
            (None, None) => Err(
                "no auth_key_file: name the cluster key file (make one with `weft keygen FILE`), \
                 or set auth = \"none\" to run without authentication"
                    .to_string(),
            ),
        }
    }

    /// What a config's security keys ask for: [`Auth::configured`], over TLS when the three
    /// TLS files are given.
    ///
    /// # Errors
    /// When the settings contradict each other or a file is unusable, naming the key or file.
    pub fn from_settings(settings: AuthSettings<'_>) -> Result<Auth, String> {
        let tls = TlsFiles::configured(
            settings.tls_cert_file,
            settings.tls_key_file,
            settings.tls_ca_file,
        )?;
        Auth::configured(settings.mode, settings.key_file)?.with_tls(tls.as_ref())
    }

    /// Whether connections are authenticated.
    pub fn is_enabled(&self) -> bool {
        self.key.is_some()
    }

    /// The key file, when there is one.
    pub fn key_file(&self) -> Option<&Path> {
        self.key.as_ref().map(|key| key.file.as_path())
    }

    /// The key a handshake with the peer named `name` proves: this process's own key on the
    /// connecting side; on a server, the cluster key for a member and the client's key,
    /// derived from it, for a named client.
    fn key_for(&self, name: &[u8]) -> hmac::Key {
        let key = &self.key.as_ref().expect("proofs need a key").key;
        if name.is_empty() || self.client_name().is_some() {
            key.clone()
        } else {
            client_key(key, name)
        }
    }
}

fn proof(
    key: &hmac::Key,
    label: &[u8],
    (version, name): (u16, &[u8]),
    nonces: [&[u8]; 2],
    binding: &[u8],
) -> hmac::Tag {
    hmac::sign(key, &proof_input(label, (version, name), nonces, binding))
}

fn verify(
    key: &hmac::Key,
    label: &[u8],
    (version, name): (u16, &[u8]),
    nonces: [&[u8]; 2],
    (binding, proof): (&[u8], &[u8]),
) -> bool {
    hmac::verify(
        key,
        &proof_input(label, (version, name), nonces, binding),
        proof,
    )
    .is_ok()
}

/// What a proof signs: its direction's label, the version, the client's name, both nonces
/// (the verifier's first) and the TLS binding, each length-prefixed where it varies.
fn proof_input(
    label: &[u8],
    (version, name): (u16, &[u8]),
    nonces: [&[u8]; 2],
    binding: &[u8],
) -> Vec<u8> {
    let mut input =
        Vec::with_capacity(label.len() + 4 + name.len() + 2 * NONCE_BYTES + binding.len());
    input.extend_from_slice(label);
    input.extend_from_slice(&version.to_le_bytes());
    input.push(name.len() as u8);
    input.extend_from_slice(name);
    input.extend_from_slice(nonces[0]);
    input.extend_from_slice(nonces[1]);
    input.push(binding.len() as u8);
    input.extend_from_slice(binding);
    input
}

const SERVER_LABEL: &[u8] = b"weft server";
const CLIENT_LABEL: &[u8] = b"weft client";

/// Reads a key file, readable by its owner only: 64 hex digits on one line for the cluster
/// key; a line `client NAME` before them for a client key. Answers the client's name, if any,
/// and the key.
fn read_key_file(file: &Path) -> Result<(Option<String>, [u8; KEY_BYTES]), String> {
    use std::io::Read;
    let mut text = String::new();
    open_private(file, "key file")?
        .read_to_string(&mut text)
        .map_err(|error| format!("cannot read the key file {}: {error}", file.display()))?;
    let mut lines = text.lines().map(str::trim).filter(|line| !line.is_empty());
    let first = lines.next().unwrap_or_default();
    let (client, key) = match first.strip_prefix("client ") {
        Some(name) => (
            Some(name.trim().to_string()),
            lines.next().unwrap_or_default(),
        ),
        None => (None, first),
    };
    let named_well = client
        .as_deref()
        .is_none_or(weft_proto::access::valid_client_name);
    match parse_key(key) {
        Some(key) if named_well && lines.next().is_none() => Ok((client, key)),
        _ => Err(format!(
            "{} does not hold a Weft key ({} hex digits on one line, after a line `client NAME` \
             for a client key): make one with `weft keygen FILE`",
            file.display(),
            2 * KEY_BYTES
        )),
    }
}

/// Opens a file that holds a secret, and checks the open file (not the path, which could be
/// swapped between a check and the open): a regular file, owned by this user or root, that
/// neither group nor others can read or write.
///
/// # Errors
/// What is wrong, naming the file and the fix.
pub(crate) fn open_private(file: &Path, what: &str) -> Result<std::fs::File, String> {
    use std::os::unix::fs::MetadataExt;
    let opened = std::fs::File::open(file)
        .map_err(|error| format!("cannot read the {what} {}: {error}", file.display()))?;
    let metadata = opened
        .metadata()
        .map_err(|error| format!("cannot read the {what} {}: {error}", file.display()))?;
    if !metadata.is_file() {
        return Err(format!(
            "the {what} {} is not a regular file",
            file.display()
        ));
    }
    // SAFETY: geteuid has no preconditions.
    let me = unsafe { libc::geteuid() };
    if metadata.uid() != me && metadata.uid() != 0 {
        return Err(format!(
            "the {what} {} belongs to user {}, not to this user or root: `chown` it",
            file.display(),
            metadata.uid()
        ));
    }
    if metadata.mode() & 0o077 != 0 {
        return Err(format!(
            "the {what} {} can be read by others (mode {:o}): run `chmod 600 {}`",
            file.display(),
            metadata.mode() & 0o777,
            file.display()
        ));
    }
    Ok(opened)
}

fn parse_key(text: &str) -> Option<[u8; KEY_BYTES]> {
    if text.len() != 2 * KEY_BYTES || !text.is_ascii() {
        return None;
    }
    let mut key = [0u8; KEY_BYTES];
    for (index, byte) in key.iter_mut().enumerate() {
        *byte = u8::from_str_radix(&text[2 * index..2 * index + 2], 16).ok()?;
    }
    Some(key)
}

/// Writes a new random key to `file` with mode 0600; an existing file is never overwritten.
///
/// # Errors
/// When the file exists or cannot be written, with the file named.
pub fn write_new_key(file: &Path) -> Result<(), String> {
    let mut key = [0u8; KEY_BYTES];
    SystemRandom::new()
        .fill(&mut key)
        .map_err(|_| "the system's random number generator failed".to_string())?;
    write_key_file(file, &hex(&key))
}

/// Writes the client key of `name` to `file` (mode 0600, never over an existing file); `auth`
/// must hold the cluster key.
///
/// # Errors
/// When `auth` holds no cluster key, the name is not valid, or the file cannot be written.
pub fn write_client_key(auth: &Auth, name: &str, file: &Path) -> Result<(), String> {
    if !weft_proto::access::valid_client_name(name) {
        return Err(format!(
            "{name:?} cannot name a client: use 1 to {} letters, digits, '.', '_' or '-'",
            weft_proto::access::CLIENT_NAME_BYTES_MAX
        ));
    }
    let cluster = match (&auth.key, auth.client_name()) {
        (Some(key), None) => &key.key,
        (Some(_), Some(other)) => {
            return Err(format!(
                "the key given is the client key of {other:?}: issuing a client key takes the \
                 cluster key"
            ))
        }
        (None, _) => return Err("issuing a client key takes the cluster key".to_string()),
    };
    let key = hmac::sign(cluster, &client_key_input(name.as_bytes()));
    write_key_file(file, &format!("client {name}\n{}", hex(key.as_ref())))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|byte| format!("{byte:02x}")).collect()
}

fn write_key_file(file: &Path, text: &str) -> Result<(), String> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut out = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(file)
        .map_err(|error| match error.kind() {
            std::io::ErrorKind::AlreadyExists => format!(
                "{} exists: a key is never overwritten (remove it first to replace it)",
                file.display()
            ),
            _ => format!("cannot create the key file {}: {error}", file.display()),
        })?;
    out.write_all(format!("{text}\n").as_bytes())
        .and_then(|()| out.sync_all())
        .map_err(|error| format!("cannot write the key file {}: {error}", file.display()))
}

/// The environment variable that names a tool's cluster key file.
pub const KEY_FILE_ENV: &str = "WEFT_KEY_FILE";

/// Where a tool finds the cluster key: `explicit` (`--key-file`), then [`KEY_FILE_ENV`], then
/// the key of a local `weft up` cluster whose management is `mgmt`, then [`SYSTEM_KEY_FILE`].
pub fn find_key_file(explicit: Option<&Path>, mgmt: &str) -> Option<PathBuf> {
    if let Some(file) = explicit {
        return Some(file.to_path_buf());
    }
    if let Some(file) = std::env::var_os(KEY_FILE_ENV).filter(|file| !file.is_empty()) {
        return Some(PathBuf::from(file));
    }
    let local = local_cluster_key(mgmt);
    if local.exists() && check_private_dir(&local_key_dir()).is_ok() {
        return Some(local);
    }
    let system = PathBuf::from(SYSTEM_KEY_FILE);
    system.exists().then_some(system)
}

/// Where a mount leaves a link to its key for the cluster whose management is `mgmt`
/// (`weft mount`, `weft up`), for the admin commands run on the same host.
pub fn local_cluster_key(mgmt: &str) -> PathBuf {
    local_key_dir().join(format!("{}.key", mgmt.replace(['/', ':'], "_")))
}

/// The directory of those links: `$XDG_RUNTIME_DIR/weft`, `/run/weft` for root, else
/// `/tmp/weft-UID`.
fn local_key_dir() -> PathBuf {
    // SAFETY: geteuid has no preconditions.
    let uid = unsafe { libc::geteuid() };
    match std::env::var_os("XDG_RUNTIME_DIR")
        .map(PathBuf::from)
        .filter(|dir| dir.is_dir())
    {
        Some(runtime) => runtime.join("weft"),
        None if uid == 0 => PathBuf::from("/run/weft"),
        None => std::env::temp_dir().join(format!("weft-{uid}")),
    }
}

/// Makes (or checks) the directory of the key links: a real directory, not a link, owned by
/// this user, with mode 0700. Another user who made it first (it may be under /tmp) could
/// otherwise plant a link to a key of their own choosing.
///
/// # Errors
/// When it cannot be made, or is not private, naming it.
pub fn private_key_dir() -> Result<PathBuf, String> {
    use std::os::unix::fs::DirBuilderExt;
    let dir = local_key_dir();
    match std::fs::DirBuilder::new().mode(0o700).create(&dir) {
        Ok(()) => {}
        Err(error) if error.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(error) => return Err(format!("cannot create {}: {error}", dir.display())),
    }
    check_private_dir(&dir)?;
    Ok(dir)
}

fn check_private_dir(dir: &Path) -> Result<(), String> {
    use std::os::unix::fs::MetadataExt;
    let metadata = std::fs::symlink_metadata(dir)
        .map_err(|error| format!("cannot use {}: {error}", dir.display()))?;
    // SAFETY: geteuid has no preconditions.
    let me = unsafe { libc::geteuid() };
    if !metadata.is_dir() || metadata.uid() != me || metadata.mode() & 0o077 != 0 {
        return Err(format!(
            "{} is not a private directory of this user (a directory owned by it with mode \
             0700): remove it, or give the key with --key-file",
            dir.display()
        ));
    }
    Ok(())
}

/// Why a handshake failed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// The first bytes are not a Weft handshake.
    BadMagic,
    /// The peer sent frames without a handshake (a Weft from before authentication).
    NoHandshake,
    /// No protocol version both sides speak: the server's range.
    Version {
        /// Lowest version the refusing side speaks.
        lowest: u16,
        /// Highest version the refusing side speaks.
        highest: u16,
    },
    /// The server needs a key and the client has none.
    KeyRequired,
    /// The peer proved another key.
    WrongKey,
    /// The client gave a name no client key can have.
    BadClientName(String),
    /// The server requires TLS and the peer came without it.
    TlsRequired,
    /// The peer began TLS and the server runs without it.
    TlsUnavailable,
    /// TLS failed: the peer's certificate is not one of the cluster's CA, or TLS broke off.
    TlsFailed(String),
    /// The handshake broke off or was malformed.
    Broken(String),
    /// No handshake within [`HANDSHAKE_TIMEOUT`].
    Timeout,
    /// Too many connections in their handshake at once: closed on arrival.
    Busy,
    /// Authenticated, but the service has its `connections_max` connections open.
    Full,
}

impl Refusal {
    fn code(&self) -> u8 {
        match self {
            Refusal::Version { .. } => 1,
            Refusal::KeyRequired => 2,
            Refusal::WrongKey => 3,
            Refusal::BadClientName(_) => 4,
            Refusal::TlsRequired => 6,
            _ => 5,
        }
    }

    /// A short name, for metrics labels.
    pub fn kind(&self) -> &'static str {
        match self {
            Refusal::BadMagic => "bad_magic",
            Refusal::NoHandshake => "no_handshake",
            Refusal::Version { .. } => "version",
            Refusal::KeyRequired => "key_required",
            Refusal::WrongKey => "wrong_key",
            Refusal::BadClientName(_) => "bad_client_name",
            Refusal::TlsRequired => "tls_required",
            Refusal::TlsUnavailable => "tls_unavailable",
            Refusal::TlsFailed(_) => "tls_failed",
            Refusal::Broken(_) => "broken",
            Refusal::Timeout => "timeout",
            Refusal::Busy => "busy",
            Refusal::Full => "full",
        }
    }
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Refusal::BadMagic => f.write_str("not a Weft handshake"),
            Refusal::NoHandshake => {
                f.write_str("sent frames without authenticating (a Weft too old for this cluster)")
            }
            Refusal::Version { lowest, highest } => write!(
                f,
                "no common protocol version (the peer speaks {lowest}-{highest})"
            ),
            Refusal::KeyRequired => f.write_str("holds no cluster key"),
            Refusal::WrongKey => f.write_str("proved another cluster key"),
            Refusal::BadClientName(name) => {
                write!(f, "named itself {name:?}, which cannot name a client")
            }
            Refusal::TlsRequired => f.write_str("came without TLS, which this server requires"),
            Refusal::TlsUnavailable => f.write_str("began TLS, which this server does not run"),
            Refusal::TlsFailed(reason) => write!(f, "failed TLS: {reason}"),
            Refusal::Broken(reason) => write!(f, "broken handshake: {reason}"),
            Refusal::Timeout => write!(f, "no handshake within {HANDSHAKE_TIMEOUT:?}"),
            Refusal::Busy => f.write_str("too many connections in their handshake at once"),
            Refusal::Full => f.write_str("the service has connections_max connections open"),
        }
    }
}

fn random_nonce() -> Result<[u8; NONCE_BYTES], Refusal> {
    let mut nonce = [0u8; NONCE_BYTES];
    SystemRandom::new()
        .fill(&mut nonce)
        .map_err(|_| Refusal::Broken("the system's random number generator failed".into()))?;
    Ok(nonce)
}

fn broken(error: std::io::Error) -> Refusal {
    Refusal::Broken(error.to_string())
}

/// The server's side of the handshake on a connection whose first bytes are
/// [`HANDSHAKE_MAGIC`]; `Ok` with the version agreed and who the peer proved to be, when it may
/// send frames.
///
/// # Errors
/// Why the peer was refused (it has been told, when it got that far).
pub async fn accept<S: AsyncRead + AsyncWrite + Unpin>(
    stream: &mut S,
    auth: &Auth,
    binding: &[u8],
) -> Result<(u16, Identity), Refusal> {
    let mut head = [0u8; 10];
    stream.read_exact(&mut head).await.map_err(broken)?;
    if head[..4] != HANDSHAKE_MAGIC {
        return Err(Refusal::BadMagic);
    }
    let lowest = u16::from_le_bytes([head[4], head[5]]);
    let highest = u16::from_le_bytes([head[6], head[7]]);
    let (flags, name_len) = (head[8], usize::from(head[9]));
    if name_len > NAME_BYTES_MAX {
        return Err(Refusal::Broken(format!(
            "a client name of {name_len} bytes"
        )));
    }
    let mut rest = vec![0u8; name_len + NONCE_BYTES];
    stream.read_exact(&mut rest).await.map_err(broken)?;
    let (name, client_nonce) = rest.split_at(name_len);

    let version = highest.min(PROTOCOL_VERSION);
    let refusal = if version < lowest.max(PROTOCOL_VERSION_MIN) {
        Some(Refusal::Version { lowest, highest })
    } else if auth.is_enabled() && flags & FLAG_HOLDS_KEY == 0 {
        Some(Refusal::KeyRequired)
    } else if !name.is_empty()
        && !std::str::from_utf8(name).is_ok_and(weft_proto::access::valid_client_name)
    {
        Some(Refusal::BadClientName(
            String::from_utf8_lossy(name).into_owned(),
        ))
    } else {
        None
    };
    if let Some(refusal) = refusal {
        refuse(stream, &refusal).await;
        return Err(refusal);
    }
    if !auth.is_enabled() {
        let mut open = vec![TAG_OPEN];
        open.extend_from_slice(&version.to_le_bytes());
        stream.write_all(&open).await.map_err(broken)?;
        return Ok((version, Identity::Member));
    }

    let key = auth.key_for(name);
    let server_nonce = random_nonce()?;
    let proof = proof(
        &key,
        SERVER_LABEL,
        (version, name),
        [client_nonce, &server_nonce],
        binding,
    );
    let mut challenge = vec![TAG_CHALLENGE];
    challenge.extend_from_slice(&version.to_le_bytes());
    challenge.extend_from_slice(&server_nonce);
    challenge.extend_from_slice(proof.as_ref());
    stream.write_all(&challenge).await.map_err(broken)?;

    let mut answer = [0u8; 1 + PROOF_BYTES];
    stream.read_exact(&mut answer[..2]).await.map_err(broken)?;
    if answer[..2] == [TAG_REFUSED, Refusal::WrongKey.code()] {
        // The client found this server's proof wrong: it holds another key.
        return Err(Refusal::WrongKey);
    }
    stream.read_exact(&mut answer[2..]).await.map_err(broken)?;
    if answer[0] != TAG_PROOF {
        return Err(Refusal::Broken(format!(
            "message {} instead of a proof",
            answer[0]
        )));
    }
    if !verify(
        &key,
        CLIENT_LABEL,
        (version, name),
        [&server_nonce, client_nonce],
        (binding, &answer[1..]),
    ) {
        refuse(stream, &Refusal::WrongKey).await;
        return Err(Refusal::WrongKey);
    }
    stream.write_all(&[TAG_WELCOME]).await.map_err(broken)?;
    let identity = match std::str::from_utf8(name) {
        Ok("") | Err(_) => Identity::Member,
        Ok(name) => Identity::Client(name.into()),
    };
    Ok((version, identity))
}

/// Tells the peer why it is refused; it may be gone already.
pub(crate) async fn refuse<S: AsyncWrite + Unpin>(stream: &mut S, refusal: &Refusal) {
    let mut message = vec![TAG_REFUSED, refusal.code()];
    message.extend_from_slice(&PROTOCOL_VERSION_MIN.to_le_bytes());
    message.extend_from_slice(&PROTOCOL_VERSION.to_le_bytes());
    let _ = stream.write_all(&message).await;
    let _ = stream.flush().await;
}

/// Why a connection could not be authenticated, from the side that connected.
#[derive(Clone, Debug)]
pub enum ConnectError {
    /// The peer could not be read or written, or answered nonsense.
    Transport(crate::client::TransportError),
    /// Authentication or version negotiation failed: what to tell the user.
    Refused(String),
    /// The server speaks no version this binary speaks.
    Version(String),
}

/// The connecting side of the handshake, offering protocol versions `versions` (lowest,
/// highest); `Ok` with the version agreed. `address` names the server in errors.
///
/// # Errors
/// [`ConnectError`] saying which side failed and what to do.
pub async fn connect<S: AsyncRead + AsyncWrite + Unpin>(
    stream: &mut S,
    (auth, (lowest, highest)): (&Auth, (u16, u16)),
    (address, binding): (&str, &[u8]),
) -> Result<u16, ConnectError> {
    let transport = |error: std::io::Error| {
        ConnectError::Transport(crate::client::TransportError::io("run the handshake")(
            error,
        ))
    };
    let client_nonce = random_nonce().map_err(|error| {
        ConnectError::Transport(crate::client::TransportError::Protocol(error.to_string()))
    })?;
    let mut hello = HANDSHAKE_MAGIC.to_vec();
    hello.extend_from_slice(&lowest.to_le_bytes());
    hello.extend_from_slice(&highest.to_le_bytes());
    hello.push(if auth.is_enabled() { FLAG_HOLDS_KEY } else { 0 });
    let name = auth.client_name().unwrap_or_default().as_bytes();
    hello.push(name.len() as u8);
    hello.extend_from_slice(name);
    hello.extend_from_slice(&client_nonce);
    stream.write_all(&hello).await.map_err(transport)?;

    let mut tag = [0u8; 1];
    stream.read_exact(&mut tag).await.map_err(transport)?;
    match tag[0] {
        TAG_REFUSED => Err(read_refusal(stream, auth, address).await),
        TAG_OPEN => {
            let mut version = [0u8; 2];
            stream.read_exact(&mut version).await.map_err(transport)?;
            if auth.is_enabled() {
                return Err(ConnectError::Refused(format!(
                    "{address} runs without authentication (auth = \"none\"), so it cannot prove \
                     it belongs to the cluster: refusing to talk to it"
                )));
            }
            Ok(u16::from_le_bytes(version))
        }
        TAG_CHALLENGE => {
            let mut challenge = [0u8; 2 + NONCE_BYTES + PROOF_BYTES];
            stream.read_exact(&mut challenge).await.map_err(transport)?;
            if !auth.is_enabled() {
                return Err(ConnectError::Refused(format!(
                    "{address} requires the cluster key: give its file with --key-file FILE \
                     (or WEFT_KEY_FILE, or auth_key_file in the config)"
                )));
            }
            let version = u16::from_le_bytes([challenge[0], challenge[1]]);
            let server_nonce = &challenge[2..2 + NONCE_BYTES];
            let server_proof = &challenge[2 + NONCE_BYTES..];
            let key = auth.key_for(name);
            if !verify(
                &key,
                SERVER_LABEL,
                (version, name),
                [&client_nonce, server_nonce],
                (binding, server_proof),
            ) {
                // Say why before hanging up, so the server's log names the cause.
                refuse(stream, &Refusal::WrongKey).await;
                return Err(wrong_key(auth, address));
            }
            let proof = proof(
                &key,
                CLIENT_LABEL,
                (version, name),
                [server_nonce, &client_nonce],
                binding,
            );
            let mut message = vec![TAG_PROOF];
            message.extend_from_slice(proof.as_ref());
            stream.write_all(&message).await.map_err(transport)?;
            stream.read_exact(&mut tag).await.map_err(transport)?;
            match tag[0] {
                TAG_WELCOME => Ok(version),
                TAG_REFUSED => Err(read_refusal(stream, auth, address).await),
                other => Err(ConnectError::Transport(
                    crate::client::TransportError::Protocol(format!(
                        "{address} answered the handshake with message {other}"
                    )),
                )),
            }
        }
        other => Err(ConnectError::Transport(
            crate::client::TransportError::Protocol(format!(
                "{address} answered the handshake with message {other}: is it a Weft service?"
            )),
        )),
    }
}

fn wrong_key(auth: &Auth, address: &str) -> ConnectError {
    let file = auth
        .key_file()
        .map(|file| file.display().to_string())
        .unwrap_or_default();
    ConnectError::Refused(format!(
        "authentication failed: the key in {file} does not match the cluster's (server {address})"
    ))
}

async fn read_refusal<S: AsyncRead + Unpin>(
    stream: &mut S,
    auth: &Auth,
    address: &str,
) -> ConnectError {
    let mut body = [0u8; 5];
    if stream.read_exact(&mut body).await.is_err() {
        return ConnectError::Refused(format!("{address} refused the connection"));
    }
    let (lowest, highest) = (
        u16::from_le_bytes([body[1], body[2]]),
        u16::from_le_bytes([body[3], body[4]]),
    );
    match body[0] {
        1 => ConnectError::Version(format!(
            "{address} speaks protocol versions {lowest}-{highest}, this binary \
             {PROTOCOL_VERSION_MIN}-{PROTOCOL_VERSION}: upgrade the older side"
        )),
        2 => ConnectError::Refused(format!(
            "{address} requires the cluster key: give its file with --key-file FILE \
             (or WEFT_KEY_FILE, or auth_key_file in the config)"
        )),
        3 => wrong_key(auth, address),
        4 => ConnectError::Refused(format!("{address} refused this client's name")),
        6 => ConnectError::Refused(format!(
            "{address} requires TLS: give tls_cert_file, tls_key_file and tls_ca_file in the \
             config (or put cert.pem, cert.key and ca.pem in a tls directory beside the key file)"
        )),
        code => ConnectError::Refused(format!("{address} refused the connection (reason {code})")),
    }
}

#[cfg(test)]
mod tests;
