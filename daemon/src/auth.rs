//! Bearer tokens. The tokens file holds only SHA-256 digests of tokens (a leaked file
//! grants nothing), each with a name, scopes (`submit`, `read`, `admin`; admin implies the
//! others) and an optional tenant: a token with a tenant sees only that tenant's runs.
//!
//! ```toml
//! [[token]]
//! name = "ci"
//! sha256 = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"
//! scopes = ["submit", "read"]
//! tenant = "vision"
//! ```

use std::collections::HashMap;
use std::path::Path;

use serde::{Deserialize, Serialize};

#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Scope {
    Submit,
    Read,
    Admin,
}

impl Scope {
    pub fn name(self) -> &'static str {
        match self {
            Scope::Submit => "submit",
            Scope::Read => "read",
            Scope::Admin => "admin",
        }
    }
}

/// Who is calling.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Principal {
    pub name: String,
    pub scopes: Vec<Scope>,
    pub tenant: Option<String>,
}

impl Principal {
    /// `--dev`: everything, every tenant.
    pub fn dev() -> Principal {
        Principal { name: "dev".into(), scopes: vec![Scope::Admin], tenant: None }
    }

    pub fn has(&self, scope: Scope) -> bool {
        self.scopes.contains(&Scope::Admin) || self.scopes.contains(&scope)
    }

    /// Which runs this caller may see.
    pub fn visibility(&self) -> xpu_store::Scope<'_> {
        match &self.tenant {
            Some(t) => xpu_store::Scope::Tenant(t),
            None => xpu_store::Scope::All,
        }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TokensFile {
    #[serde(default)]
    token: Vec<TokenEntry>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TokenEntry {
    name: String,
    sha256: String,
    scopes: Vec<Scope>,
    tenant: Option<String>,
}

/// The tokens xpud accepts.
#[derive(Clone, Debug, Default)]
pub struct Tokens {
    by_digest: HashMap<String, Principal>,
}

#[derive(Debug, thiserror::Error)]
pub enum TokensError {
    #[error("tokens file {file}: {message}")]
    File { file: String, message: String },
}

pub fn digest(token: &str) -> String {
    crate::jobs::sha256_hex(token.as_bytes())
}

impl Tokens {
    pub fn load(path: &Path) -> Result<Tokens, TokensError> {
        let file = path.display().to_string();
        let fail = |message: String| TokensError::File { file: file.clone(), message };
        let text = std::fs::read_to_string(path).map_err(|e| fail(e.to_string()))?;
        Tokens::parse(&text).map_err(fail)
    }

    pub fn parse(text: &str) -> Result<Tokens, String> {
        let parsed: TokensFile = toml::from_str(text).map_err(|e| e.to_string())?;
        let mut by_digest = HashMap::new();
        for (i, t) in parsed.token.into_iter().enumerate() {
            let d = t.sha256.to_ascii_lowercase();
            if d.len() != 64 || !d.bytes().all(|b| b.is_ascii_hexdigit()) {
                return Err(format!(
                    "token[{i}] ({}): sha256 must be 64 hex digits (the digest, not the token)",
                    t.name
                ));
            }
            if t.scopes.is_empty() {
                return Err(format!("token[{i}] ({}): scopes is empty", t.name));
            }
            let p = Principal { name: t.name, scopes: t.scopes, tenant: t.tenant };
            if by_digest.insert(d, p).is_some() {
                return Err(format!("token[{i}]: the same token is listed twice"));
            }
        }
        Ok(Tokens { by_digest })
    }

    /// The principal of an `Authorization` header value, if it names a known token.
    pub fn check(&self, header: &str) -> Option<&Principal> {
        let token = header.strip_prefix("Bearer ")?.trim();
        self.by_digest.get(&digest(token))
    }

    pub fn len(&self) -> usize {
        self.by_digest.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_digest.is_empty()
    }
}

/// A fresh random token (256 bits, hex) from the OS.
pub fn new_token() -> std::io::Result<String> {
    use std::io::Read;
    let mut bytes = [0u8; 32];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut bytes)?;
    Ok(format!("xpu_{}", bytes.iter().map(|b| format!("{b:02x}")).collect::<String>()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_checked_by_digest() {
        let text = format!(
            "[[token]]\nname = \"ci\"\nsha256 = \"{}\"\nscopes = [\"submit\"]\ntenant = \"acme\"\n",
            digest("s3cret")
        );
        let tokens = Tokens::parse(&text).unwrap();
        let p = tokens.check("Bearer s3cret").unwrap();
        assert_eq!((p.name.as_str(), p.tenant.as_deref()), ("ci", Some("acme")));
        assert!(p.has(Scope::Submit) && !p.has(Scope::Read));
        assert!(tokens.check("Bearer wrong").is_none());
        assert!(tokens.check("s3cret").is_none(), "the scheme is required");
        assert!(
            Tokens::parse("[[token]]\nname = \"x\"\nsha256 = \"s3cret\"\nscopes = [\"read\"]\n")
                .unwrap_err()
                .contains("64 hex digits")
        );
        assert!(Tokens::parse("[[token]]\nname = 1\n").is_err());
        assert!(Tokens::parse("garbage ===").is_err());
        assert!(Principal::dev().has(Scope::Admin) && Principal::dev().has(Scope::Read));
    }
}
