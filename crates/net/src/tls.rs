//! TLS for node and client connections: the cluster's certificate authority, the
//! certificates it issues (`myriad cert`), and the rustls configurations an endpoint uses
//! when [`crate::Config::tls`] is set.
//!
//! Job: turn a directory of PEM files into a [`TlsConfig`] (both sides of a connection:
//! the dialer's client configuration, the acceptor's server configuration), and write
//! such a directory ([`create_ca`], [`issue`]). The byte-level use of a TLS session on a
//! socket is `crate::stream`'s.
//!
//! Invariants:
//! - Mutual TLS always: an acceptor requires a certificate signed by the cluster CA from
//!   every connector (node or client); a connector accepts only an acceptor whose
//!   certificate is signed by the CA and names [`NODE_NAME`]. Every certificate the CA
//!   issues names it: clients accept connections too (superpeers dial them for
//!   heartbeats and events).
//! - A certificate names its role as a DNS name in its subject alternative names
//!   ([`CertRole::dns_name`]: `peer.myriad`, `superpeer.myriad`, `client.myriad`).
//! - Private keys are written `0600`, never logged; TLS 1.3 and 1.2 only (rustls' safe
//!   defaults), ring as the crypto provider (no OpenSSL, no C toolchain beyond `cc`).
//! - No session tickets: a connection's state never has to be written back by its reader.
//!
//! Called by: the endpoint (dial and accept, `crate::endpoint`), the node and client
//! configuration (which load a [`TlsConfig`]), and `myriad cert` (the CLI).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::server::WebPkiClientVerifier;
use rustls::{ClientConfig, RootCertStore, ServerConfig};

/// The DNS name every certificate of the cluster carries, and the server name a connector
/// verifies the acceptor against (with the CA's signature).
pub const NODE_NAME: &str = "node.myriad";

/// The file name of the CA certificate in a TLS directory.
pub const CA_CERT_FILE: &str = "ca.pem";

/// The file name of the CA's private key in a TLS directory (`0600`; only `myriad cert`
/// needs it, nodes do not).
pub const CA_KEY_FILE: &str = "ca.key";

/// The common name of the cluster CA.
const CA_COMMON_NAME: &str = "Myriad cluster CA";

/// Why a TLS directory could not be read or written, or a configuration not be built.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A file could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// A PEM file held nothing usable (no certificate, no key, or bad PEM).
    #[error("{path}: {what}")]
    Pem {
        /// The file.
        path: PathBuf,
        /// What was wrong.
        what: String,
    },
    /// rustls refused the configuration (e.g. the key does not match the certificate).
    #[error("TLS configuration: {0}")]
    Config(String),
    /// Generating a key or a certificate failed.
    #[error("certificate generation: {0}")]
    Generate(String),
    /// A file that would be overwritten exists already.
    #[error("{0} exists already (remove it first)")]
    Exists(PathBuf),
}

/// A certificate's role, named in the certificate as a DNS name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CertRole {
    /// A peer (stores chunks).
    Peer,
    /// A superpeer (Raft group member).
    Superpeer,
    /// A client application or the terminal.
    Client,
}

impl CertRole {
    /// The DNS name that names this role in a certificate.
    pub fn dns_name(self) -> &'static str {
        match self {
            CertRole::Peer => "peer.myriad",
            CertRole::Superpeer => "superpeer.myriad",
            CertRole::Client => "client.myriad",
        }
    }

    /// Its name: `peer`, `superpeer` or `client`.
    pub fn name(self) -> &'static str {
        match self {
            CertRole::Peer => "peer",
            CertRole::Superpeer => "superpeer",
            CertRole::Client => "client",
        }
    }

    /// The role a (verified) certificate names: the one of [`CertRole::dns_name`] among
    /// its subject alternative names; `None` if it names none or more than one.
    pub fn of_certificate(cert: &CertificateDer<'_>) -> Option<CertRole> {
        let cert = webpki::EndEntityCert::try_from(cert).ok()?;
        let mut found = None;
        for role in [CertRole::Peer, CertRole::Superpeer, CertRole::Client] {
            let name = ServerName::try_from(role.dns_name()).ok()?;
            if cert.verify_is_valid_for_subject_name(&name).is_ok() {
                if found.is_some() {
                    return None;
                }
                found = Some(role);
            }
        }
        found
    }

    /// Parses `peer`, `superpeer` or `client`.
    pub fn parse(text: &str) -> Option<Self> {
        match text {
            "peer" => Some(CertRole::Peer),
            "superpeer" => Some(CertRole::Superpeer),
            "client" => Some(CertRole::Client),
            _ => None,
        }
    }
}

/// Both sides of TLS for one endpoint: built once, shared by every connection.
#[derive(Clone)]
pub struct TlsConfig {
    pub(crate) client: Arc<ClientConfig>,
    pub(crate) server: Arc<ServerConfig>,
    pub(crate) server_name: ServerName<'static>,
}

impl std::fmt::Debug for TlsConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsConfig")
            .field("server_name", &self.server_name)
            .finish_non_exhaustive()
    }
}

fn io_error(path: &Path) -> impl FnOnce(std::io::Error) -> TlsError + '_ {
    move |source| TlsError::Io {
        path: path.to_path_buf(),
        source,
    }
}

fn pem_error(path: &Path, what: impl std::fmt::Display) -> TlsError {
    TlsError::Pem {
        path: path.to_path_buf(),
        what: what.to_string(),
    }
}

fn read_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let bytes = std::fs::read(path).map_err(io_error(path))?;
    let certs = CertificateDer::pem_slice_iter(&bytes)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| pem_error(path, e))?;
    if certs.is_empty() {
        return Err(pem_error(path, "no certificate in the file"));
    }
    Ok(certs)
}

fn read_key(path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    let bytes = std::fs::read(path).map_err(io_error(path))?;
    PrivateKeyDer::from_pem_slice(&bytes).map_err(|e| pem_error(path, e))
}

fn config_error(error: impl std::fmt::Display) -> TlsError {
    TlsError::Config(error.to_string())
}

impl TlsConfig {
    /// Loads the CA certificate, this node's (or client's) certificate chain and its key
    /// from PEM files.
    pub fn from_pem_files(ca: &Path, cert: &Path, key: &Path) -> Result<Self, TlsError> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut roots = RootCertStore::empty();
        for ca_cert in read_certs(ca)? {
            roots.add(ca_cert).map_err(|e| pem_error(ca, e))?;
        }
        let roots = Arc::new(roots);
        let chain = read_certs(cert)?;
        let key = read_key(key)?;
        let client = ClientConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(config_error)?
            .with_root_certificates(roots.clone())
            .with_client_auth_cert(chain.clone(), key.clone_key())
            .map_err(config_error)?;
        let verifier = WebPkiClientVerifier::builder_with_provider(roots, provider.clone())
            .build()
            .map_err(config_error)?;
        let mut server = ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(config_error)?
            .with_client_cert_verifier(verifier)
            .with_single_cert(chain, key)
            .map_err(config_error)?;
        server.send_tls13_tickets = 0;
        let server_name = ServerName::try_from(NODE_NAME).map_err(config_error)?;
        Ok(Self {
            client: Arc::new(client),
            server: Arc::new(server),
            server_name,
        })
    }

    /// Loads `DIR/ca.pem`, `DIR/NAME.pem` and `DIR/NAME.key` (the layout [`issue`] writes).
    pub fn from_dir(dir: &Path, name: &str) -> Result<Self, TlsError> {
        Self::from_pem_files(
            &dir.join(CA_CERT_FILE),
            &dir.join(format!("{name}.pem")),
            &dir.join(format!("{name}.key")),
        )
    }
}

fn generate_error(error: impl std::fmt::Display) -> TlsError {
    TlsError::Generate(error.to_string())
}

/// Writes `bytes` to a new file `path` (refusing to overwrite), readable by its owner only
/// when `private`.
fn write_new(path: &Path, bytes: &[u8], private: bool) -> Result<(), TlsError> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut options = std::fs::OpenOptions::new();
    options
        .write(true)
        .create_new(true)
        .mode(if private { 0o600 } else { 0o644 });
    let mut file = options.open(path).map_err(|e| {
        if e.kind() == std::io::ErrorKind::AlreadyExists {
            TlsError::Exists(path.to_path_buf())
        } else {
            TlsError::Io {
                path: path.to_path_buf(),
                source: e,
            }
        }
    })?;
    file.write_all(bytes).map_err(io_error(path))?;
    file.sync_all().map_err(io_error(path))
}

/// The CA's parameters: always the same, so that the CA certificate rebuilt from its key
/// by [`issue`] has the subject and key identifier of the one written by [`create_ca`].
fn ca_params() -> Result<rcgen::CertificateParams, TlsError> {
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).map_err(generate_error)?;
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, CA_COMMON_NAME);
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    params.key_usages = vec![
        rcgen::KeyUsagePurpose::KeyCertSign,
        rcgen::KeyUsagePurpose::CrlSign,
        rcgen::KeyUsagePurpose::DigitalSignature,
    ];
    params.not_before = rcgen::date_time_ymd(2024, 1, 1);
    params.not_after = rcgen::date_time_ymd(2099, 12, 31);
    params.use_authority_key_identifier_extension = false;
    Ok(params)
}

/// Creates a cluster CA in `dir` (created if missing): `ca.pem` (the certificate every
/// node and client trusts) and `ca.key` (`0600`, needed only to issue certificates).
/// Refuses to overwrite an existing CA.
pub fn create_ca(dir: &Path) -> Result<(), TlsError> {
    std::fs::create_dir_all(dir).map_err(io_error(dir))?;
    let key = rcgen::KeyPair::generate().map_err(generate_error)?;
    let cert = ca_params()?.self_signed(&key).map_err(generate_error)?;
    write_new(&dir.join(CA_KEY_FILE), key.serialize_pem().as_bytes(), true)?;
    write_new(&dir.join(CA_CERT_FILE), cert.pem().as_bytes(), false)
}

/// Issues a certificate for `name` in `role`, signed by the CA in `dir`: writes
/// `DIR/NAME.pem` and `DIR/NAME.key` (`0600`). The certificate names the role and
/// [`NODE_NAME`]; `hosts` adds DNS names or IP addresses (informational: the
/// connector verifies [`NODE_NAME`], so nodes may move between addresses).
pub fn issue(dir: &Path, name: &str, role: CertRole, hosts: &[String]) -> Result<(), TlsError> {
    if name.is_empty()
        || !name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '.')
        || name.starts_with('.')
        || name == "ca"
    {
        return Err(TlsError::Generate(format!(
            "bad certificate name {name:?} (letters, digits, '-', '_', '.'; not \"ca\")"
        )));
    }
    let ca_key_path = dir.join(CA_KEY_FILE);
    let ca_key_pem = std::fs::read_to_string(&ca_key_path).map_err(io_error(&ca_key_path))?;
    let ca_key = rcgen::KeyPair::from_pem(&ca_key_pem).map_err(|e| pem_error(&ca_key_path, e))?;
    let ca_cert = ca_params()?.self_signed(&ca_key).map_err(generate_error)?;
    let mut names = vec![role.dns_name().to_owned(), NODE_NAME.to_owned()];
    names.extend(hosts.iter().cloned());
    let mut params = rcgen::CertificateParams::new(names).map_err(generate_error)?;
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, name);
    params.not_before = rcgen::date_time_ymd(2024, 1, 1);
    params.not_after = rcgen::date_time_ymd(2099, 12, 31);
    params.extended_key_usages = vec![
        rcgen::ExtendedKeyUsagePurpose::ServerAuth,
        rcgen::ExtendedKeyUsagePurpose::ClientAuth,
    ];
    let key = rcgen::KeyPair::generate().map_err(generate_error)?;
    let cert = params
        .signed_by(&key, &ca_cert, &ca_key)
        .map_err(generate_error)?;
    write_new(
        &dir.join(format!("{name}.key")),
        key.serialize_pem().as_bytes(),
        true,
    )?;
    write_new(
        &dir.join(format!("{name}.pem")),
        cert.pem().as_bytes(),
        false,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn issued_certificates_load_and_names_are_checked() {
        let temp = tempfile::tempdir().unwrap();
        let dir = temp.path().to_path_buf();
        create_ca(&dir).unwrap();
        issue(&dir, "p1", CertRole::Peer, &["10.0.0.1".into()]).unwrap();
        issue(&dir, "c1", CertRole::Client, &[]).unwrap();
        TlsConfig::from_dir(&dir, "p1").unwrap();
        TlsConfig::from_dir(&dir, "c1").unwrap();
        issue(&dir, "s1", CertRole::Superpeer, &[]).unwrap();
        for (name, role) in [
            ("p1", CertRole::Peer),
            ("c1", CertRole::Client),
            ("s1", CertRole::Superpeer),
        ] {
            let cert = &read_certs(&dir.join(format!("{name}.pem"))).unwrap()[0];
            assert_eq!(CertRole::of_certificate(cert), Some(role), "{name}");
        }
        let ca = &read_certs(&dir.join(CA_CERT_FILE)).unwrap()[0];
        assert_eq!(CertRole::of_certificate(ca), None, "the CA names no role");
        assert!(matches!(create_ca(&dir), Err(TlsError::Exists(_))));
        assert!(issue(&dir, "ca", CertRole::Peer, &[]).is_err());
        assert!(issue(&dir, "../x", CertRole::Peer, &[]).is_err());
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(dir.join("p1.key"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
    }
}
