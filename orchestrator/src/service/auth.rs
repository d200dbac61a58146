//! API keys. Only SHA-256 digests are kept; a presented key is hashed and compared
//! against every stored digest in constant time, so neither the keys nor the timing of
//! a comparison reveal anything. A key's tenant id (the first 8 bytes of its digest, in
//! hex) names who owns a sandbox; it is stable across restarts, so a restarted server
//! gives adopted sandboxes back to the same key.

use sha2::{Digest, Sha256};

/// Who made a request. With auth off every request is the tenant `anonymous`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Tenant(pub String);

/// The accepted keys.
pub struct Keys {
    digests: Vec<[u8; 32]>,
    disabled: bool,
    /// Tenants that may change the shared images (import, overwrite, delete); `None`:
    /// every tenant, which is only the default when there is one key.
    operators: Option<Vec<Tenant>>,
}

impl std::fmt::Debug for Keys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Keys")
            .field("count", &self.digests.len())
            .field("disabled", &self.disabled)
            .finish()
    }
}

fn digest(key: &str) -> [u8; 32] {
    Sha256::digest(key.as_bytes()).into()
}

/// Whether two digests are equal, in time that does not depend on where they differ.
fn ct_eq(a: &[u8; 32], b: &[u8; 32]) -> bool {
    bool::from(subtle::ConstantTimeEq::ct_eq(&a[..], &b[..]))
}

impl Keys {
    /// These keys (empty strings ignored).
    pub fn new<I: IntoIterator<Item = S>, S: AsRef<str>>(keys: I) -> Keys {
        Keys {
            digests: keys
                .into_iter()
                .filter(|k| !k.as_ref().is_empty())
                .map(|k| digest(k.as_ref()))
                .collect(),
            disabled: false,
            operators: None,
        }
    }

    /// Makes `keys` (also accepted as ordinary keys) the only ones that may change the
    /// shared images. Without this, a server with one key lets it do so, and a server
    /// with several keys lets none: one tenant must not change what another's
    /// sandboxes run.
    pub fn with_operators<I: IntoIterator<Item = S>, S: AsRef<str>>(mut self, keys: I) -> Keys {
        let mut operators = Vec::new();
        for k in keys.into_iter().filter(|k| !k.as_ref().is_empty()) {
            let d = digest(k.as_ref());
            if !self.digests.iter().any(|s| ct_eq(s, &d)) {
                self.digests.push(d);
            }
            operators.push(Tenant(hex::encode(&d[..8])));
        }
        self.operators = Some(operators);
        self
    }

    /// Whether `tenant` may import, overwrite or delete shared images.
    pub fn is_operator(&self, tenant: &Tenant) -> bool {
        if self.disabled {
            return true;
        }
        match &self.operators {
            Some(ops) => ops.contains(tenant),
            None => self.digests.len() == 1,
        }
    }

    /// Accepts every request, as the tenant `anonymous`.
    pub fn disabled() -> Keys {
        Keys {
            digests: Vec::new(),
            disabled: true,
            operators: None,
        }
    }

    /// Whether auth is off.
    pub fn is_disabled(&self) -> bool {
        self.disabled
    }

    /// How many keys are accepted.
    pub fn len(&self) -> usize {
        self.digests.len()
    }

    /// Whether no key is accepted.
    pub fn is_empty(&self) -> bool {
        self.digests.is_empty()
    }

    /// The tenant of `key`, if it is accepted.
    pub fn authenticate(&self, key: Option<&str>) -> Option<Tenant> {
        if self.disabled {
            return Some(Tenant("anonymous".into()));
        }
        let d = digest(key?);
        // Every digest is compared: no early exit on a match.
        let mut found = false;
        for stored in &self.digests {
            found |= ct_eq(stored, &d);
        }
        found.then(|| Tenant(hex::encode(&d[..8])))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_checked_and_name_their_tenant() {
        let keys = Keys::new(["alpha", "beta", ""]);
        assert_eq!(keys.len(), 2);
        let a = keys.authenticate(Some("alpha")).unwrap();
        let b = keys.authenticate(Some("beta")).unwrap();
        assert_ne!(a, b);
        assert_eq!(a, keys.authenticate(Some("alpha")).unwrap(), "stable");
        assert!(keys.authenticate(Some("gamma")).is_none());
        assert!(keys.authenticate(Some("")).is_none());
        assert!(keys.authenticate(None).is_none());
        assert!(
            format!("{keys:?}").contains("count: 2"),
            "no key material in Debug"
        );
    }

    #[test]
    fn only_operators_change_shared_images() {
        let one = Keys::new(["solo"]);
        assert!(one.is_operator(&one.authenticate(Some("solo")).unwrap()));
        let two = Keys::new(["a", "b"]);
        assert!(!two.is_operator(&two.authenticate(Some("a")).unwrap()));
        let ops = Keys::new(["a", "b"]).with_operators(["admin"]);
        assert!(ops.is_operator(&ops.authenticate(Some("admin")).unwrap()));
        assert!(!ops.is_operator(&ops.authenticate(Some("b")).unwrap()));
        assert!(Keys::disabled().is_operator(&Tenant("anonymous".into())));
    }

    #[test]
    fn disabled_auth_accepts_everyone_as_one_tenant() {
        let keys = Keys::disabled();
        assert_eq!(keys.authenticate(None), Some(Tenant("anonymous".into())));
        assert_eq!(
            keys.authenticate(Some("x")),
            Some(Tenant("anonymous".into()))
        );
    }
}
