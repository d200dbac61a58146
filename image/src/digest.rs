//! Content digests: parsing `sha256:<hex>` and hashing bytes as they stream past.
//!
//! Only sha256 is supported: it is what every registry and `docker save` produce, and a
//! digest of another algorithm is refused rather than trusted unverified.

use std::io::{self, Read};

use sha2::{Digest as _, Sha256};

use super::ImageError;

/// Prefix of every digest the store accepts.
pub const SHA256_PREFIX: &str = "sha256:";

/// Checks that `digest` is `sha256:` followed by 64 lowercase hex digits and returns the
/// hex part. Digests end up in file names, so anything else is refused here.
pub fn hex_of(digest: &str) -> Result<&str, ImageError> {
    let Some(hex) = digest.strip_prefix(SHA256_PREFIX) else {
        return Err(ImageError::invalid(
            format!("digest {digest:?}"),
            "only sha256 digests are supported",
        ));
    };
    if hex.len() != 64
        || !hex
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    {
        return Err(ImageError::invalid(
            format!("digest {digest:?}"),
            "expected 64 lowercase hex digits after sha256:",
        ));
    }
    Ok(hex)
}

/// The `sha256:<hex>` digest of `bytes`.
pub fn of_bytes(bytes: &[u8]) -> String {
    format!("{SHA256_PREFIX}{}", hex::encode(Sha256::digest(bytes)))
}

/// Fails with [`ImageError::DigestMismatch`] unless `bytes` hash to `expected`.
pub fn verify_bytes(what: &str, bytes: &[u8], expected: &str) -> Result<(), ImageError> {
    let actual = of_bytes(bytes);
    if actual == expected {
        Ok(())
    } else {
        Err(ImageError::DigestMismatch {
            what: what.to_string(),
            expected: expected.to_string(),
            actual,
        })
    }
}

/// A reader that hashes and counts every byte read through it.
pub struct HashingReader<R> {
    inner: R,
    hasher: Sha256,
    bytes: u64,
}

impl<R: Read> HashingReader<R> {
    /// Wraps `inner`.
    pub fn new(inner: R) -> Self {
        HashingReader {
            inner,
            hasher: Sha256::new(),
            bytes: 0,
        }
    }

    /// The digest and count of the bytes read so far.
    pub fn finish(self) -> (String, u64) {
        (
            format!("{SHA256_PREFIX}{}", hex::encode(self.hasher.finalize())),
            self.bytes,
        )
    }
}

impl<R: Read> Read for HashingReader<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.hasher.update(&buf[..n]);
        self.bytes += n as u64;
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_of_accepts_only_sha256_hex() {
        let good = format!("sha256:{}", "a".repeat(64));
        assert_eq!(hex_of(&good).ok(), Some("a".repeat(64).as_str()));
        assert!(hex_of(&format!("sha512:{}", "a".repeat(128))).is_err());
        assert!(hex_of(&format!("sha256:{}", "A".repeat(64))).is_err());
        assert!(hex_of("sha256:../../etc").is_err());
        assert!(hex_of(&format!("sha256:{}", "a".repeat(63))).is_err());
    }

    #[test]
    fn hashing_reader_matches_of_bytes() {
        let data = b"hello layer".repeat(1000);
        let mut reader = HashingReader::new(&data[..]);
        io::copy(&mut reader, &mut io::sink()).unwrap();
        let (digest, bytes) = reader.finish();
        assert_eq!(digest, of_bytes(&data));
        assert_eq!(bytes, data.len() as u64);
        assert!(verify_bytes("x", &data, &digest).is_ok());
        assert!(matches!(
            verify_bytes("x", b"other", &digest),
            Err(ImageError::DigestMismatch { .. })
        ));
    }
}
