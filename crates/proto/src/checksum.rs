//! The one checksum of Weft: CRC32C (Castagnoli), hardware accelerated where the CPU has it.
//! Chunk payloads carry it on the wire and it is checked on receipt.
//!
//! `crc-fast` picks the widest instructions the CPU has at run time: with AVX-512 and
//! VPCLMULQDQ it folds 64 bytes at a time with carry-less multiplies alongside the `crc32`
//! instruction, about 1.7x the rate of the `crc32`-instruction-only code on data not in cache
//! (measured on this project's machine, 512 KiB pieces).

/// Returns the CRC32C of `bytes`.
pub fn crc32c(bytes: &[u8]) -> u32 {
    // CRC-32/ISCSI is CRC32C; the 32-bit value sits in the low bits.
    crc_fast::checksum(crc_fast::CrcAlgorithm::Crc32Iscsi, bytes) as u32
}

/// A CRC32C computed over bytes given in pieces: the same value as [`crc32c`] of them all.
pub struct Crc32c(crc_fast::Digest);

impl Crc32c {
    pub fn new() -> Crc32c {
        Crc32c(crc_fast::Digest::new(crc_fast::CrcAlgorithm::Crc32Iscsi))
    }

    pub fn update(&mut self, bytes: &[u8]) {
        self.0.update(bytes);
    }

    pub fn value(&self) -> u32 {
        self.0.finalize() as u32
    }
}

impl Default for Crc32c {
    fn default() -> Crc32c {
        Crc32c::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Goal: the checksum matches the published CRC32C check value, so every process agrees.
    #[test]
    fn known_vector() {
        assert_eq!(crc32c(b"123456789"), 0xe306_9283);
        assert_eq!(crc32c(b""), 0);
        let mut pieces = Crc32c::new();
        pieces.update(b"1234");
        pieces.update(b"56789");
        assert_eq!(pieces.value(), 0xe306_9283);
    }

    // Goal: every length and alignment gives the same checksum as a plain bitwise CRC32C,
    // across the sizes where the implementation changes method (small tails, 64-byte folds).
    #[test]
    fn matches_bitwise_crc32c() {
        fn bitwise(bytes: &[u8]) -> u32 {
            let mut crc = !0u32;
            for byte in bytes {
                crc ^= u32::from(*byte);
                for _ in 0..8 {
                    crc = if crc & 1 == 1 {
                        (crc >> 1) ^ 0x82F6_3B78
                    } else {
                        crc >> 1
                    };
                }
            }
            !crc
        }
        let data: Vec<u8> = (0..5000u32)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
            .collect();
        for start in 0..9 {
            for len in [
                0, 1, 7, 15, 16, 31, 63, 64, 65, 127, 255, 256, 1000, 4096, 4990,
            ] {
                let bytes = &data[start..start + len];
                assert_eq!(crc32c(bytes), bitwise(bytes), "{len} bytes at {start}");
            }
        }
    }
}
