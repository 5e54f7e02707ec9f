//! CRC32C of an entry: the header bytes before the checksum field, then the payload.
//!
//! Job: compute the checksum of two slices as if they were one, in one call (the entry
//! checksum covers the header and the payload, which are not contiguous while the header
//! is being built).
//!
//! Callers: the header encoder.

/// CRC32C of `head` followed by `tail` (the same value as `crc32c(head ++ tail)`).
#[inline]
pub(crate) fn crc32c_two(head: &[u8], tail: &[u8]) -> u32 {
    crc32c::crc32c_append(crc32c::crc32c(head), tail)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn equals_the_checksum_of_the_concatenation(
            head in proptest::collection::vec(any::<u8>(), 0..40),
            tail in proptest::collection::vec(any::<u8>(), 0..600),
        ) {
            let mut all = head.clone();
            all.extend_from_slice(&tail);
            prop_assert_eq!(crc32c_two(&head, &tail), crc32c::crc32c(&all));
        }
    }
}
