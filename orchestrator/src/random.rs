//! Random ids, tokens and API keys: the one place the orchestrator asks the kernel's
//! generator for bytes (through `getrandom`).
//!
//! A failure is an error the caller must handle, never bytes used anyway: an API key or
//! agent token made of zeroed or predictable bytes would be guessable. [`hex_from`]
//! takes the source as a parameter so tests can inject a failing one.

/// The kernel's random number generator failed.
#[derive(Debug, thiserror::Error)]
#[error("the kernel's random number generator failed: {0}")]
pub struct RandomError(#[from] getrandom::Error);

/// `n` random bytes as lowercase hex (`2n` characters), for ids, tokens and keys.
pub fn hex(n: usize) -> Result<String, RandomError> {
    hex_from(n, getrandom::fill)
}

/// `n` bytes from `fill` as hex. When `fill` fails, whatever it wrote is discarded.
pub fn hex_from(
    n: usize,
    fill: impl FnOnce(&mut [u8]) -> Result<(), getrandom::Error>,
) -> Result<String, RandomError> {
    let mut bytes = vec![0u8; n];
    fill(&mut bytes)?;
    Ok(hex::encode(bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_is_two_digits_a_byte_and_differs_between_calls() {
        let a = hex(16).unwrap();
        assert_eq!(a.len(), 32);
        assert!(a.bytes().all(|b| b.is_ascii_hexdigit()));
        assert_ne!(a, hex(16).unwrap());
    }

    #[test]
    fn regression_a_failing_generator_is_an_error_not_zero_bytes() {
        // The source wrote something, then failed: nothing of it may come out.
        let partial = hex_from(8, |buf| {
            buf[..4].copy_from_slice(&[1, 2, 3, 4]);
            Err(getrandom::Error::UNEXPECTED)
        });
        assert!(partial.is_err());
        let fixed = hex_from(2, |buf| {
            buf.copy_from_slice(&[0xab, 0x01]);
            Ok(())
        });
        assert_eq!(fixed.unwrap(), "ab01");
    }
}
