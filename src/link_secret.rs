//! The secret that keys page links, as a value: 32 bytes, written as 64 hex digits. Below
//! the configuration (which checks `auth.link_secret`) and the pages (which key links
//! with it, `api::pages::secret` says where it is kept).

/// Bytes of a link secret.
pub const SECRET_LEN: usize = 32;

/// A link secret (its `Debug` shows nothing of it).
#[derive(Clone, PartialEq, Eq)]
pub struct LinkSecret([u8; SECRET_LEN]);

impl std::fmt::Debug for LinkSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("LinkSecret(..)")
    }
}

impl LinkSecret {
    /// A fresh secret from the operating system's CSPRNG.
    pub fn generate() -> anyhow::Result<Self> {
        use rand::TryRngCore;
        let mut b = [0u8; SECRET_LEN];
        rand::rngs::OsRng
            .try_fill_bytes(&mut b)
            .map_err(|e| anyhow::anyhow!("reading the OS random generator: {e}"))?;
        Ok(Self(b))
    }

    pub const fn from_bytes(b: [u8; SECRET_LEN]) -> Self {
        Self(b)
    }

    pub fn bytes(&self) -> &[u8; SECRET_LEN] {
        &self.0
    }

    /// The secret from its text form: 64 hex digits (surrounding whitespace ignored).
    pub fn parse(text: &str) -> Result<Self, String> {
        let t = text.trim();
        if t.len() != 2 * SECRET_LEN || !t.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(format!(
                "expected {} hex digits (e.g. from `openssl rand -hex {SECRET_LEN}`), got {} characters",
                2 * SECRET_LEN,
                t.len()
            ));
        }
        let mut b = [0u8; SECRET_LEN];
        for (i, out) in b.iter_mut().enumerate() {
            *out = u8::from_str_radix(&t[2 * i..2 * i + 2], 16).expect("checked hex");
        }
        Ok(Self(b))
    }

    /// The text form: 64 lower-case hex digits.
    pub fn to_hex(&self) -> String {
        self.0.iter().map(|b| format!("{b:02x}")).collect()
    }
}
