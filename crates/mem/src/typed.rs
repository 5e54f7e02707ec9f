//! Typed chunks: values that encode themselves into a chunk's bytes and decode back.
//!
//! The trait, its implementations for plain types, and the [`MemoryManager`] calls that
//! store and load typed values (each one a create, read or write of the [crate](crate)'s
//! byte API plus the codec). Called by the node for its own records and by tests.

use crate::{ChunkId, MemError, MemResult, MemoryManager};

/// A type stored as one chunk. `encode` must write exactly `encoded_len` bytes, and
/// `decode` must accept what `encode` wrote; it gets untrusted bytes (a chunk may have been
/// written by anyone) and must return an error rather than panic on anything else.
pub trait ChunkCodec: Sized {
    /// Bytes `encode` writes for this value (at least 1).
    fn encoded_len(&self) -> usize;
    /// Writes the value into `out`, which is exactly `encoded_len()` bytes long.
    fn encode(&self, out: &mut [u8]);
    /// Reads a value from a chunk's bytes.
    fn decode(bytes: &[u8]) -> Result<Self, String>;
}

impl ChunkCodec for u64 {
    fn encoded_len(&self) -> usize {
        8
    }
    fn encode(&self, out: &mut [u8]) {
        out.copy_from_slice(&self.to_le_bytes());
    }
    fn decode(bytes: &[u8]) -> Result<Self, String> {
        let array: [u8; 8] = bytes
            .try_into()
            .map_err(|_| format!("expected 8 bytes, got {}", bytes.len()))?;
        Ok(u64::from_le_bytes(array))
    }
}

impl ChunkCodec for Vec<u8> {
    fn encoded_len(&self) -> usize {
        self.len()
    }
    fn encode(&self, out: &mut [u8]) {
        out.copy_from_slice(self);
    }
    fn decode(bytes: &[u8]) -> Result<Self, String> {
        Ok(bytes.to_vec())
    }
}

impl ChunkCodec for String {
    fn encoded_len(&self) -> usize {
        self.len()
    }
    fn encode(&self, out: &mut [u8]) {
        out.copy_from_slice(self.as_bytes());
    }
    fn decode(bytes: &[u8]) -> Result<Self, String> {
        String::from_utf8(bytes.to_vec()).map_err(|error| error.to_string())
    }
}

impl MemoryManager {
    /// Creates a chunk holding `value` encoded.
    pub fn create_typed<T: ChunkCodec>(&self, value: &T) -> MemResult<ChunkId> {
        let cid = self.create(value.encoded_len())?;
        if let Err(error) = self.write_with(cid, |bytes| value.encode(bytes)) {
            let _ = self.remove(cid);
            return Err(error);
        }
        Ok(cid)
    }

    /// Decodes the chunk as a `T`.
    pub fn get_typed<T: ChunkCodec>(&self, cid: ChunkId) -> MemResult<T> {
        self.read_with(cid, T::decode)?
            .map_err(|reason| MemError::Decode { cid, reason })
    }

    /// Stores `value` in the chunk, resizing it if the encoding's size differs.
    pub fn put_typed<T: ChunkCodec>(&self, cid: ChunkId, value: &T) -> MemResult<()> {
        let len = value.encoded_len();
        if self.size(cid)? != len {
            self.resize(cid, len)?;
        }
        self.write_with(cid, |bytes| {
            if bytes.len() == len {
                value.encode(bytes);
                Ok(())
            } else {
                Err(MemError::SizeMismatch {
                    cid,
                    size: bytes.len(),
                    len,
                })
            }
        })?
    }
}
