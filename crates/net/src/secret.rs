//! The cluster secret's file: generated, written owner-only, read back.
//!
//! # Job
//! The HMAC handshake ([`crate::wire`]) proves that both ends know one shared secret.
//! That secret lives in a file, never on a command line (a `ps` listing shows it to every
//! user of the machine), in a log or in `cluster.json`:
//! - [`generate`] draws [`GENERATED_SECRET_BYTES`] random bytes from the operating
//!   system's generator and spells them as lowercase hex (so the file is text, and any
//!   client language can read it as one line);
//! - [`create_file`] writes a new secret to a file created with mode `0600` (never a file
//!   that exists: a race with another writer fails instead of sharing);
//! - [`read_file`] reads one back: the first line, trailing whitespace (a newline) removed,
//!   1 to [`SECRET_BYTES_MAX`] bytes, from a file that no group or other user can read or
//!   write (like ssh's private keys: a secret readable by all is no secret);
//! - [`read_or_create`] does either, for a cluster directory that may already hold one;
//! - [`from_env`] reads the file named by [`SECRET_FILE_ENV`], if that is set.
//!
//! # Invariants
//! - No function here logs or formats a secret; errors name the file, never its content.
//! - A file this module creates is never readable by anyone but its owner, not even for a
//!   moment (the mode is given to `open`, not set afterwards).
//!
//! # Who calls it
//! The launcher (`myriad cluster start` writes `DIR/secret`), the node commands
//! (`--secret-file`, `MYRIAD_SECRET_FILE`, `secret_file` in the configuration), the
//! terminal and clients.

use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use rand::RngCore;

use crate::config::SECRET_BYTES_MAX;

/// The environment variable that names the secret file (for nodes, the terminal, clients).
pub const SECRET_FILE_ENV: &str = "MYRIAD_SECRET_FILE";
/// The secret file's name in a cluster directory (`DIR/secret`).
pub const SECRET_FILE_NAME: &str = "secret";
/// Random bytes of a generated secret (written as twice as many hex digits).
pub const GENERATED_SECRET_BYTES: usize = 32;

/// Why a secret file could not be created or read.
#[derive(Debug, thiserror::Error)]
pub enum SecretError {
    /// The file could not be created, written or read.
    #[error("cluster secret file {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// The file holds no secret, or one longer than [`SECRET_BYTES_MAX`].
    #[error("cluster secret file {path}: {reason}")]
    Invalid {
        /// The file.
        path: PathBuf,
        /// What is wrong (never the content).
        reason: String,
    },
    /// Group or other users may read or write the file.
    #[error(
        "cluster secret file {path} has mode {mode:04o}: other users may read it; \
         run `chmod 600 {path}`"
    )]
    Unprotected {
        /// The file.
        path: PathBuf,
        /// Its permission bits.
        mode: u32,
    },
}

/// A new random secret: [`GENERATED_SECRET_BYTES`] bytes from the OS, as lowercase hex.
pub fn generate() -> String {
    let mut bytes = [0u8; GENERATED_SECRET_BYTES];
    rand::rngs::OsRng.fill_bytes(&mut bytes);
    bytes.iter().map(|byte| format!("{byte:02x}")).collect()
}

/// Creates `path` (which must not exist) with mode `0600` and writes a [`generate`]d
/// secret to it, followed by a newline; returns the secret's bytes (without the newline).
pub fn create_file(path: &Path) -> Result<Vec<u8>, SecretError> {
    let io = |source| SecretError::Io {
        path: path.to_owned(),
        source,
    };
    let secret = generate();
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .map_err(io)?;
    file.write_all(format!("{secret}\n").as_bytes())
        .map_err(io)?;
    file.sync_all().map_err(io)?;
    Ok(secret.into_bytes())
}

/// Reads the secret of `path`: its first line without trailing whitespace. Refuses a file
/// that group or others may read or write, an empty secret and one over
/// [`SECRET_BYTES_MAX`] bytes.
pub fn read_file(path: &Path) -> Result<Vec<u8>, SecretError> {
    let io = |source| SecretError::Io {
        path: path.to_owned(),
        source,
    };
    let metadata = std::fs::metadata(path).map_err(io)?;
    let mode = metadata.permissions().mode() & 0o777;
    if mode & 0o077 != 0 {
        return Err(SecretError::Unprotected {
            path: path.to_owned(),
            mode,
        });
    }
    if metadata.len() > (SECRET_BYTES_MAX as u64) * 2 + 2 {
        return Err(SecretError::Invalid {
            path: path.to_owned(),
            reason: format!("longer than {SECRET_BYTES_MAX} bytes"),
        });
    }
    let bytes = std::fs::read(path).map_err(io)?;
    let line = bytes.split(|byte| *byte == b'\n').next().unwrap_or(&[]);
    let end = line
        .iter()
        .rposition(|byte| !byte.is_ascii_whitespace())
        .map_or(0, |last| last + 1);
    let secret = &line[..end];
    if secret.is_empty() || secret.len() > SECRET_BYTES_MAX {
        return Err(SecretError::Invalid {
            path: path.to_owned(),
            reason: format!("the secret must have 1 to {SECRET_BYTES_MAX} bytes"),
        });
    }
    Ok(secret.to_vec())
}

/// Reads `path` if it exists, else creates it with a new secret ([`create_file`]).
pub fn read_or_create(path: &Path) -> Result<Vec<u8>, SecretError> {
    match create_file(path) {
        Ok(secret) => Ok(secret),
        Err(SecretError::Io { source, .. })
            if source.kind() == std::io::ErrorKind::AlreadyExists =>
        {
            read_file(path)
        }
        Err(error) => Err(error),
    }
}

/// The secret of the file named by [`SECRET_FILE_ENV`]; `None` if the variable is unset
/// or empty.
pub fn from_env() -> Result<Option<Vec<u8>>, SecretError> {
    match std::env::var_os(SECRET_FILE_ENV) {
        Some(path) if !path.is_empty() => read_file(Path::new(&path)).map(Some),
        _ => Ok(None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_created_secret_is_owner_only_and_reads_back() {
        let dir = std::env::temp_dir().join(format!("myriad-secret-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("created");
        let _ = std::fs::remove_file(&path);
        let secret = create_file(&path).unwrap();
        assert_eq!(secret.len(), 2 * GENERATED_SECRET_BYTES);
        assert!(secret.iter().all(u8::is_ascii_hexdigit));
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        assert_eq!(read_file(&path).unwrap(), secret);
        assert_eq!(
            read_or_create(&path).unwrap(),
            secret,
            "an existing file is kept"
        );
        assert!(create_file(&path).is_err(), "never overwrites");
        // Two generated secrets differ.
        assert_ne!(generate(), generate());

        // Readable by others: refused, and the message does not show the secret.
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let error = read_file(&path).unwrap_err().to_string();
        assert!(error.contains("chmod 600"), "{error}");
        assert!(!error.contains(std::str::from_utf8(&secret).unwrap()));

        // Empty and whitespace-only files hold no secret; a CRLF line is trimmed.
        let other = dir.join("empty");
        std::fs::write(&other, "  \n").unwrap();
        std::fs::set_permissions(&other, std::fs::Permissions::from_mode(0o400)).unwrap();
        assert!(matches!(
            read_file(&other),
            Err(SecretError::Invalid { .. })
        ));
        std::fs::set_permissions(&other, std::fs::Permissions::from_mode(0o600)).unwrap();
        std::fs::write(&other, "abc\r\nignored\n").unwrap();
        assert_eq!(read_file(&other).unwrap(), b"abc");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
