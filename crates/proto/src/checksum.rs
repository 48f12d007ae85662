//! The one checksum of Weft: CRC32C (Castagnoli), hardware accelerated where the CPU has it.
//! Chunk payloads carry it on the wire and it is checked on receipt.

/// Returns the CRC32C of `bytes`.
pub fn crc32c(bytes: &[u8]) -> u32 {
    crc32c::crc32c(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    // Goal: the checksum matches the published CRC32C check value, so every process agrees.
    #[test]
    fn known_vector() {
        assert_eq!(crc32c(b"123456789"), 0xe306_9283);
    }
}
