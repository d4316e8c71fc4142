//! Signed page links: a browser cannot send a bearer header on a plain navigation, so the
//! curator's backend (a reader key) mints a short-lived link for ONE user's receipt page,
//! and an admin key one for the operator overview, and hands it to the browser.
//!
//! A link's token is `EXPIRES.KEYID.MAC`: the expiry in milliseconds since the epoch, the
//! first [`KEY_ID_LEN`] hex digits of the minting key's SHA-256, and HMAC-SHA256 over
//! (scope, expiry, key id) keyed by HMAC-SHA256(server secret, the minting key's full
//! SHA-256). The server secret ([`super::secret`]) is 32 random bytes kept out of the
//! database, so:
//! - a link opens one page (one user's receipt, or the overview) until it expires;
//! - revoking the minting key (or rotating it: a new key, the old one revoked) kills its
//!   links at once, since the key's hash is no longer in the key table;
//! - rotating the server secret (`dprec keys rotate-link-secret`) kills every link;
//! - whoever reads the database (a backup: it holds every key's SHA-256) cannot mint a
//!   link without the secret file;
//! - a link minted by a key whose role is later too low (impossible today: roles do not
//!   change) would fail the role check done at every use.
//!
//! Everything here is pure (the time and the secret are parameters); the MAC is compared
//! in constant time ([`Mac::verify_slice`]).

use hmac::{Hmac, Mac};
use sha2::Sha256;

use super::secret::LinkSecret;

/// Default lifetime of a link (15 minutes).
pub const DEFAULT_TTL_SECS: u64 = 900;
/// Longest lifetime a link may ask for (1 hour).
pub const MAX_TTL_SECS: u64 = 3600;
/// Hex digits of the minting key's SHA-256 carried by a link (64 bits: enough to find the
/// key among many, nothing about the 192 bits that key the MAC).
pub const KEY_ID_LEN: usize = 16;

/// The one page a link opens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LinkScope {
    /// The receipt page of this user.
    Receipt(String),
    /// The operator overview.
    Overview,
}

impl LinkScope {
    /// The scope as MAC input: the user id is length-prefixed, so no id can pose as
    /// another scope or another id.
    fn encode(&self) -> String {
        match self {
            Self::Receipt(user) => format!("receipt:{}:{user}", user.len()),
            Self::Overview => "overview".into(),
        }
    }
}

/// A link token's parts, parsed but not yet verified.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LinkToken<'a> {
    pub expires_ms: i64,
    pub key_id: &'a str,
    mac: Vec<u8>,
}

/// The MAC key of the links minted by the key whose SHA-256 is `key_hash`:
/// HMAC-SHA256(secret, label || key hash). Neither part alone derives it.
fn link_key(secret: &LinkSecret, key_hash: &str) -> [u8; 32] {
    let mut m =
        Hmac::<Sha256>::new_from_slice(secret.bytes()).expect("HMAC takes a key of any length");
    m.update(b"dprec page link key v2\n");
    m.update(key_hash.as_bytes());
    m.finalize().into_bytes().into()
}

fn mac_of(
    scope: &LinkScope,
    secret: &LinkSecret,
    key_hash: &str,
    expires_ms: i64,
    key_id: &str,
) -> Hmac<Sha256> {
    let mut m = Hmac::<Sha256>::new_from_slice(&link_key(secret, key_hash))
        .expect("HMAC takes a key of any length");
    m.update(
        format!(
            "dprec page link v2\n{}\n{expires_ms}\n{key_id}",
            scope.encode()
        )
        .as_bytes(),
    );
    m
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) || !s.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).ok())
        .collect()
}

/// The token of a link for `scope`, minted by the key whose SHA-256 (hex) is `key_hash`
/// under the server's `secret`, valid until `expires_ms`.
pub fn mint(scope: &LinkScope, secret: &LinkSecret, key_hash: &str, expires_ms: i64) -> String {
    let key_id = &key_hash[..KEY_ID_LEN.min(key_hash.len())];
    let mac = mac_of(scope, secret, key_hash, expires_ms, key_id)
        .finalize()
        .into_bytes();
    format!("{expires_ms}.{key_id}.{}", hex(&mac))
}

/// Splits a token into its parts (`None` when it is not of the form `EXPIRES.KEYID.MAC`).
pub fn parse(token: &str) -> Option<LinkToken<'_>> {
    let mut parts = token.split('.');
    let (e, k, m) = (parts.next()?, parts.next()?, parts.next()?);
    if parts.next().is_some() || k.len() != KEY_ID_LEN || !k.bytes().all(|b| b.is_ascii_hexdigit())
    {
        return None;
    }
    Some(LinkToken {
        expires_ms: e.parse().ok()?,
        key_id: k,
        mac: unhex(m)?,
    })
}

impl LinkToken<'_> {
    /// Whether the token opens `scope` at `now_ms`, minted under `secret` by the key whose
    /// SHA-256 is `key_hash` (the caller finds the key by [`LinkToken::key_id`] and checks
    /// its role).
    pub fn opens(
        &self,
        scope: &LinkScope,
        secret: &LinkSecret,
        key_hash: &str,
        now_ms: i64,
    ) -> bool {
        now_ms < self.expires_ms
            && key_hash.starts_with(self.key_id)
            && mac_of(scope, secret, key_hash, self.expires_ms, self.key_id)
                .verify_slice(&self.mac)
                .is_ok()
    }
}

/// The expiry of a link asked to live `ttl_secs` (default [`DEFAULT_TTL_SECS`]) from
/// `now_ms`, or why the lifetime is refused (0 or above [`MAX_TTL_SECS`]).
pub fn expiry(now_ms: i64, ttl_secs: Option<u64>) -> Result<i64, String> {
    let ttl = ttl_secs.unwrap_or(DEFAULT_TTL_SECS);
    if !(1..=MAX_TTL_SECS).contains(&ttl) {
        return Err(format!(
            "ttl_secs must be in 1..={MAX_TTL_SECS} (default {DEFAULT_TTL_SECS}), got {ttl}"
        ));
    }
    Ok(now_ms + (ttl as i64) * 1000)
}

#[cfg(test)]
mod tests {
    use super::*;

    const H: &str = "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff";
    const OTHER: &str = "00112233445566778899aabbccddeeffffffffffffffffffffffffffffffffff";
    const S: LinkSecret = LinkSecret::from_bytes([7; 32]);

    #[test]
    fn a_link_opens_its_scope_until_it_expires() {
        let alice = LinkScope::Receipt("alice".into());
        let t = mint(&alice, &S, H, 10_000);
        let p = parse(&t).unwrap();
        assert_eq!(p.key_id, &H[..KEY_ID_LEN]);
        assert!(p.opens(&alice, &S, H, 9_999));
        assert!(!p.opens(&alice, &S, H, 10_000), "expired at its expiry");
        assert!(!p.opens(&LinkScope::Receipt("bob".into()), &S, H, 0));
        assert!(!p.opens(&LinkScope::Overview, &S, H, 0));
        // Same key id, other key (a rotated key, or a collision on the id): refused.
        assert!(!p.opens(&alice, &S, OTHER, 0));
    }

    #[test]
    fn tampered_tokens_are_refused() {
        let s = LinkScope::Receipt("a".into());
        let t = mint(&s, &S, H, 10_000);
        // A later expiry with the old MAC.
        let longer = t.replacen("10000", "99999", 1);
        assert!(!parse(&longer).unwrap().opens(&s, &S, H, 0));
        // One flipped MAC digit.
        let mut flipped = t.clone().into_bytes();
        let last = flipped.len() - 1;
        flipped[last] = if flipped[last] == b'0' { b'1' } else { b'0' };
        let flipped = String::from_utf8(flipped).unwrap();
        assert!(!parse(&flipped).unwrap().opens(&s, &S, H, 0));
        // A user id that would read as another scope's encoding.
        let tricky = LinkScope::Receipt("1:a".into());
        assert!(!parse(&mint(&tricky, &S, H, 10_000))
            .unwrap()
            .opens(&s, &S, H, 0));
        for bad in [
            "",
            "1.2",
            "x.0011223344556677.00",
            "1.0011.00",
            "1.0011223344556677.0g",
            "1.0011223344556677.00.1",
        ] {
            assert!(parse(bad).is_none(), "{bad:?}");
        }
    }

    /// What a reader of the database can compute, the minting key's SHA-256, does not
    /// mint a link: neither the former MAC keyed by the hash alone nor the current MAC
    /// under any other secret (a rotated one) opens the page.
    #[test]
    fn the_key_hash_alone_mints_nothing() {
        let s = LinkScope::Receipt("alice".into());
        let key_id = &H[..KEY_ID_LEN];
        let mut v1 = Hmac::<Sha256>::new_from_slice(H.as_bytes()).unwrap();
        v1.update(format!("dprec page link v1\n{}\n10000\n{key_id}", s.encode()).as_bytes());
        let forged = format!("10000.{key_id}.{}", hex(&v1.finalize().into_bytes()));
        assert!(!parse(&forged).unwrap().opens(&s, &S, H, 0));
        let rotated = LinkSecret::from_bytes([8; 32]);
        let old = mint(&s, &S, H, 10_000);
        assert!(parse(&old).unwrap().opens(&s, &S, H, 0));
        assert!(!parse(&old).unwrap().opens(&s, &rotated, H, 0));
    }

    #[test]
    fn lifetimes_are_bounded() {
        assert_eq!(expiry(1_000, None), Ok(1_000 + 900_000));
        assert_eq!(expiry(0, Some(1)), Ok(1_000));
        assert!(expiry(0, Some(0)).is_err());
        assert!(expiry(0, Some(MAX_TTL_SECS + 1)).is_err());
    }
}
