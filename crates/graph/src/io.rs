//! Edge-list files: real graphs loaded instead of generated ones.
//!
//! # Job
//! [`read_share`] reads part `part` of `parts` of an edge list, so that every slave reads
//! only its own share and nobody holds the whole list:
//! - [`EdgeFormat::Text`]: one edge per line, two decimal vertex IDs separated by
//!   whitespace (further columns such as weights are ignored); empty lines and lines
//!   starting with `#` or `%` are skipped. Part `p` takes the edges whose number `i`
//!   (counting edges, not lines) has `i mod parts = p`.
//! - [`EdgeFormat::Binary`]: the Graph500 reference's `packed_edge` file, two
//!   little-endian `u64` per edge; part `p` reads its byte range with a seek.
//!
//! # Invariants
//! A malformed line, a vertex ID that does not fit `u32` or a binary file whose length is
//! not a multiple of 16 is an error naming the place, never a panic.
//!
//! # Who calls it
//! The load task ([`crate::task`]), tests.

use std::fs::File;
use std::io::{BufRead, BufReader, Read, Seek, SeekFrom};
use std::path::Path;

use thiserror::Error;

use crate::gen::share;
use crate::Edge;

/// An edge-list file's format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum EdgeFormat {
    /// Text, one `u v` per line.
    Text,
    /// Binary, two little-endian `u64` per edge.
    Binary,
}

/// Why an edge list could not be read.
#[derive(Debug, Error)]
pub enum ReadError {
    /// The file could not be read.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// The error.
        source: std::io::Error,
    },
    /// A line or record is not an edge.
    #[error("{path}:{place}: {message}")]
    Malformed {
        /// The file.
        path: String,
        /// Line number (text) or edge number (binary).
        place: u64,
        /// What is wrong.
        message: String,
    },
}

fn io(path: &Path, source: std::io::Error) -> ReadError {
    ReadError::Io {
        path: path.display().to_string(),
        source,
    }
}

fn vertex(path: &Path, place: u64, raw: u64) -> Result<u32, ReadError> {
    u32::try_from(raw)
        .ok()
        .filter(|&v| v != u32::MAX)
        .ok_or_else(|| ReadError::Malformed {
            path: path.display().to_string(),
            place,
            message: format!("vertex {raw} does not fit 32 bits"),
        })
}

/// Reads part `part` of `parts` of the edge list in `path` (see the module documentation).
pub fn read_share(
    path: &Path,
    format: EdgeFormat,
    part: usize,
    parts: usize,
) -> Result<Vec<Edge>, ReadError> {
    let parts = parts.max(1);
    let mut file = File::open(path).map_err(|e| io(path, e))?;
    match format {
        EdgeFormat::Binary => {
            let length = file.metadata().map_err(|e| io(path, e))?.len();
            if length % 16 != 0 {
                return Err(ReadError::Malformed {
                    path: path.display().to_string(),
                    place: length / 16,
                    message: format!("{length} bytes is not a whole number of 16-byte edges"),
                });
            }
            let (start, end) = share(length / 16, part, parts);
            file.seek(SeekFrom::Start(start * 16))
                .map_err(|e| io(path, e))?;
            let mut reader = BufReader::with_capacity(1 << 20, file);
            let mut edges = Vec::with_capacity((end - start) as usize);
            let mut record = [0u8; 16];
            for number in start..end {
                reader.read_exact(&mut record).map_err(|e| io(path, e))?;
                let mut half = [0u8; 8];
                half.copy_from_slice(&record[..8]);
                let u = vertex(path, number, u64::from_le_bytes(half))?;
                half.copy_from_slice(&record[8..]);
                let v = vertex(path, number, u64::from_le_bytes(half))?;
                edges.push((u, v));
            }
            Ok(edges)
        }
        EdgeFormat::Text => {
            let reader = BufReader::with_capacity(1 << 20, file);
            let mut edges = Vec::new();
            let mut number = 0u64;
            for (index, line) in reader.lines().enumerate() {
                let line = line.map_err(|e| io(path, e))?;
                let line = line.trim();
                if line.is_empty() || line.starts_with('#') || line.starts_with('%') {
                    continue;
                }
                let mine = number % parts as u64 == part as u64;
                number += 1;
                if !mine {
                    continue;
                }
                let place = index as u64 + 1;
                let mut fields = line.split_whitespace();
                let mut next = || -> Result<u32, ReadError> {
                    let field = fields.next().unwrap_or("");
                    let raw: u64 = field.parse().map_err(|_| ReadError::Malformed {
                        path: path.display().to_string(),
                        place,
                        message: format!("{field:?} is not a vertex ID"),
                    })?;
                    vertex(path, place, raw)
                };
                let u = next()?;
                let v = next()?;
                edges.push((u, v));
            }
            Ok(edges)
        }
    }
}

/// Writes `edges` in `format` (tests and tools).
pub fn write(path: &Path, format: EdgeFormat, edges: &[Edge]) -> std::io::Result<()> {
    let mut out = Vec::new();
    for &(u, v) in edges {
        match format {
            EdgeFormat::Text => out.extend_from_slice(format!("{u} {v}\n").as_bytes()),
            EdgeFormat::Binary => {
                out.extend_from_slice(&u64::from(u).to_le_bytes());
                out.extend_from_slice(&u64::from(v).to_le_bytes());
            }
        }
    }
    std::fs::write(path, out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shares_of_both_formats_make_up_the_file() {
        let dir = tempfile::tempdir().expect("tempdir");
        let edges: Vec<Edge> = (0..101u32).map(|i| (i, (i * 7) % 50)).collect();
        for format in [EdgeFormat::Text, EdgeFormat::Binary] {
            let path = dir.path().join(format!("{format:?}"));
            write(&path, format, &edges).expect("write");
            let mut all = Vec::new();
            for part in 0..3 {
                all.extend(read_share(&path, format, part, 3).expect("read"));
            }
            all.sort_unstable();
            let mut want = edges.clone();
            want.sort_unstable();
            assert_eq!(all, want, "{format:?}");
        }
    }

    #[test]
    fn malformed_files_are_errors() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("bad.txt");
        std::fs::write(&path, "# comment\n1 2\n3 x\n").expect("write");
        let error = read_share(&path, EdgeFormat::Text, 0, 1).expect_err("malformed");
        assert!(error.to_string().contains(":3:"), "{error}");
        std::fs::write(&path, [0u8; 17]).expect("write");
        assert!(read_share(&path, EdgeFormat::Binary, 0, 1).is_err());
    }
}
