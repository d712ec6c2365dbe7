//! Data roots: every path a program names resolves inside configured directories (for
//! `xpuctl run`: the working directory and the program's directory). `..` that leaves a root,
//! absolute paths outside every root and symlinks that lead out are refused (CWE-22); the
//! check is made on canonical paths, so a symlink cannot smuggle a path out.

use std::path::{Component, Path, PathBuf};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DataRoots {
    roots: Vec<PathBuf>,
}

impl DataRoots {
    /// Roots that do not exist are dropped; the rest are canonicalized.
    pub fn new(roots: impl IntoIterator<Item = PathBuf>) -> DataRoots {
        let mut out: Vec<PathBuf> = Vec::new();
        for r in roots {
            if let Ok(c) = std::fs::canonicalize(&r)
                && !out.contains(&c)
            {
                out.push(c);
            }
        }
        DataRoots { roots: out }
    }

    pub fn roots(&self) -> &[PathBuf] {
        &self.roots
    }

    fn inside(&self, p: &Path) -> bool {
        self.roots.iter().any(|r| p.starts_with(r))
    }

    fn describe(&self) -> String {
        self.roots.iter().map(|r| r.display().to_string()).collect::<Vec<_>>().join(", ")
    }

    /// The file `requested` names, for reading: it must exist inside a root.
    pub fn resolve_read(&self, requested: &str) -> Result<PathBuf, String> {
        for candidate in self.candidates(requested)? {
            if let Ok(c) = std::fs::canonicalize(&candidate) {
                if self.inside(&c) {
                    return Ok(c);
                }
                return Err(format!(
                    "`{requested}` leads outside the data roots ({}) through a symlink",
                    self.describe()
                ));
            }
        }
        Err(format!("`{requested}` does not exist in the data roots ({})", self.describe()))
    }

    /// The file `requested` names, for writing: its directory must exist inside a root, and
    /// an existing file there must not be a symlink leading out.
    pub fn resolve_write(&self, requested: &str) -> Result<PathBuf, String> {
        let candidate = self
            .candidates(requested)?
            .into_iter()
            .next()
            .ok_or_else(|| "no data root".to_string())?;
        let name =
            candidate.file_name().ok_or_else(|| format!("`{requested}` names no file"))?.to_owned();
        let parent = candidate.parent().unwrap_or(Path::new("."));
        let dir = std::fs::canonicalize(parent)
            .map_err(|_| format!("the directory of `{requested}` does not exist"))?;
        if !self.inside(&dir) {
            return Err(format!("`{requested}` is outside the data roots ({})", self.describe()));
        }
        let target = dir.join(name);
        if let Ok(c) = std::fs::canonicalize(&target)
            && !self.inside(&c)
        {
            return Err(format!("`{requested}` is a symlink leading outside the data roots"));
        }
        Ok(target)
    }

    /// Lexically checked candidates, one per root (or the absolute path itself).
    fn candidates(&self, requested: &str) -> Result<Vec<PathBuf>, String> {
        if requested.is_empty() || requested.contains('\0') {
            return Err("an empty or invalid path".into());
        }
        let p = Path::new(requested);
        if p.is_absolute() {
            let n = normalize(p)
                .ok_or_else(|| format!("`{requested}` climbs above the filesystem root"))?;
            if !self.inside(&n) {
                return Err(format!(
                    "`{requested}` is outside the data roots ({})",
                    self.describe()
                ));
            }
            return Ok(vec![n]);
        }
        let mut out = Vec::new();
        for r in &self.roots {
            match normalize(&r.join(p)) {
                Some(n) if n.starts_with(r) => out.push(n),
                _ => {
                    return Err(format!(
                        "`{requested}` climbs out of the data roots with `..` (roots: {})",
                        self.describe()
                    ));
                }
            }
        }
        Ok(out)
    }
}

/// Resolves `.` and `..` without touching the filesystem; `None` when `..` climbs above `/`.
fn normalize(p: &Path) -> Option<PathBuf> {
    let mut out = PathBuf::new();
    for c in p.components() {
        match c {
            Component::ParentDir => {
                if !out.pop() {
                    return None;
                }
            }
            Component::CurDir => {}
            other => out.push(other.as_os_str()),
        }
    }
    Some(out)
}
