//! Located diagnostics: every problem with a policy or inventory names `file:line:col`, a
//! stable code (`P0001`…, listed in docs/policies.md), a message and, where it helps, a hint.

use std::fmt;

use serde::Serialize;

/// Where a setting came from: a file position, or a non-file source (environment variable,
/// job override, built-in default) with line 0.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub struct Origin {
    pub file: String,
    pub line: usize,
    pub col: usize,
}

impl Origin {
    pub fn new(file: impl Into<String>, line: usize, col: usize) -> Origin {
        Origin { file: file.into(), line, col }
    }

    /// A source without positions (`env XPU_POLICY__…`, `job override`).
    pub fn source(what: impl Into<String>) -> Origin {
        Origin { file: what.into(), line: 0, col: 0 }
    }

    /// `file:line` (what explanations print).
    pub fn short(&self) -> String {
        if self.line == 0 { self.file.clone() } else { format!("{}:{}", self.file, self.line) }
    }
}

impl fmt::Display for Origin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.line == 0 {
            f.write_str(&self.file)
        } else {
            write!(f, "{}:{}:{}", self.file, self.line, self.col)
        }
    }
}

#[derive(Copy, Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Severity {
    Error,
    Warning,
}

/// One problem found in a policy.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Diagnostic {
    pub severity: Severity,
    pub code: &'static str,
    pub at: Origin,
    /// The policy key concerned (`engines.order`), when there is one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    pub message: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub help: Option<String>,
}

impl Diagnostic {
    pub fn error(code: &'static str, at: Origin, message: impl Into<String>) -> Diagnostic {
        Diagnostic {
            severity: Severity::Error,
            code,
            at,
            key: None,
            message: message.into(),
            help: None,
        }
    }

    pub fn warning(code: &'static str, at: Origin, message: impl Into<String>) -> Diagnostic {
        Diagnostic { severity: Severity::Warning, ..Diagnostic::error(code, at, message) }
    }

    pub fn with_key(mut self, key: impl Into<String>) -> Diagnostic {
        self.key = Some(key.into());
        self
    }

    pub fn with_help(mut self, help: Option<String>) -> Diagnostic {
        self.help = help;
        self
    }

    pub fn is_error(&self) -> bool {
        self.severity == Severity::Error
    }
}

impl fmt::Display for Diagnostic {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let sev = match self.severity {
            Severity::Error => "error",
            Severity::Warning => "warning",
        };
        write!(f, "{}: {sev}[{}]: {}", self.at, self.code, self.message)?;
        if let Some(h) = &self.help {
            write!(f, "\n  help: {h}")?;
        }
        Ok(())
    }
}

/// Diagnostics of one failed load or check.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{}", .0.iter().map(|d| d.to_string()).collect::<Vec<_>>().join("\n"))]
pub struct Diagnostics(pub Vec<Diagnostic>);

/// The closest candidate to `word`, if close enough to be a likely typo.
pub fn did_you_mean<'a>(
    word: &str,
    candidates: impl IntoIterator<Item = &'a str>,
) -> Option<String> {
    let lower = word.to_ascii_lowercase();
    candidates
        .into_iter()
        .map(|c| {
            let exact = c.eq_ignore_ascii_case(word);
            let c_lower = c.to_ascii_lowercase();
            // Jaro-Winkler for prefixes and drift; Damerau-Levenshtein for short swapped words.
            let edits = strsim::damerau_levenshtein(&lower, &c_lower) as f64;
            let by_edits = 1.0 - edits / lower.len().max(c_lower.len()).max(1) as f64;
            let score = strsim::jaro_winkler(&lower, &c_lower).max(by_edits + 0.15);
            (if exact { 2.0 } else { score }, c)
        })
        .filter(|(score, _)| *score >= 0.8)
        .max_by(|a, b| a.0.total_cmp(&b.0))
        .map(|(_, c)| format!("did you mean `{c}`?"))
}

/// A did-you-mean from a serde message of the form "unknown field `x`, expected one of `a`, `b`".
pub fn did_you_mean_from_message(message: &str) -> Option<String> {
    let (_, rest) = message.split_once('`')?;
    let (word, rest) = rest.split_once('`')?;
    let expected = rest.split_once("expected")?.1;
    let options: Vec<&str> = expected.split('`').skip(1).step_by(2).collect();
    did_you_mean(word, options.iter().copied()).or_else(|| {
        (!options.is_empty()).then(|| format!("expected one of: {}", options.join(", ")))
    })
}
