//! Diagnostics: a stable code (`E0001`…, listed in docs/minilang.md), a primary span with a
//! label, optional secondary spans (e.g. where an immutable binding was made) and help.
//! Rendered with codespan-reporting as `error[E0101]: …` + `--> file:line:col` + the source
//! line with the span underlined.

use codespan_reporting::diagnostic::{Diagnostic as CsDiagnostic, Label, Severity as CsSeverity};
use codespan_reporting::files::SimpleFile;
use codespan_reporting::term::{self, Config};

use crate::Span;

#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Severity {
    Error,
    Warning,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Diagnostic {
    pub severity: Severity,
    pub code: &'static str,
    pub message: String,
    pub span: Span,
    pub label: String,
    pub secondary: Vec<(Span, String)>,
    pub help: Option<String>,
}

impl Diagnostic {
    pub fn error(code: &'static str, span: Span, message: impl Into<String>) -> Diagnostic {
        Diagnostic {
            severity: Severity::Error,
            code,
            message: message.into(),
            span,
            label: String::new(),
            secondary: Vec::new(),
            help: None,
        }
    }

    pub fn label(mut self, label: impl Into<String>) -> Diagnostic {
        self.label = label.into();
        self
    }

    pub fn secondary(mut self, span: Span, label: impl Into<String>) -> Diagnostic {
        self.secondary.push((span, label.into()));
        self
    }

    pub fn help(mut self, help: Option<String>) -> Diagnostic {
        self.help = help;
        self
    }

    pub fn is_error(&self) -> bool {
        self.severity == Severity::Error
    }

    /// `line:col` (1-based) of the primary span in `src`.
    pub fn line_col(&self, src: &str) -> (usize, usize) {
        let before = &src[..self.span.start.min(src.len())];
        let line = before.matches('\n').count() + 1;
        let col = before.rsplit('\n').next().map(|l| l.chars().count()).unwrap_or(0) + 1;
        (line, col)
    }
}

/// Renders diagnostics as plain text (no colour), the way `xpuctl check` prints them.
pub fn render(file_name: &str, src: &str, diags: &[Diagnostic]) -> String {
    let file = SimpleFile::new(file_name, src);
    let config = Config::default();
    let mut out = Vec::new();
    let mut writer = term::termcolor::NoColor::new(&mut out);
    for d in diags {
        let clamp =
            |s: Span| s.start.min(src.len())..s.end.min(src.len()).max(s.start.min(src.len()));
        let mut labels = vec![Label::primary((), clamp(d.span)).with_message(d.label.clone())];
        for (s, l) in &d.secondary {
            labels.push(Label::secondary((), clamp(*s)).with_message(l.clone()));
        }
        let cs = CsDiagnostic::new(match d.severity {
            Severity::Error => CsSeverity::Error,
            Severity::Warning => CsSeverity::Warning,
        })
        .with_code(d.code)
        .with_message(d.message.clone())
        .with_labels(labels)
        .with_notes(d.help.iter().map(|h| format!("help: {h}")).collect());
        // Writing to a Vec cannot fail; a span the file cannot map is skipped, not a panic.
        let _ = term::emit(&mut writer, &config, &file, &cs);
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The closest name to `word` among `candidates`, if close enough to be a typo.
pub fn did_you_mean<'a>(
    word: &str,
    candidates: impl IntoIterator<Item = &'a str>,
) -> Option<String> {
    candidates
        .into_iter()
        .filter(|c| *c != word)
        .map(|c| {
            let edits = strsim::damerau_levenshtein(word, c) as f64;
            let by_edits = 1.0 - edits / word.len().max(c.len()).max(1) as f64;
            (strsim::jaro_winkler(word, c).max(by_edits + 0.15), c)
        })
        .filter(|(score, _)| *score >= 0.8)
        .max_by(|a, b| a.0.total_cmp(&b.0))
        .map(|(_, c)| format!("did you mean `{c}`?"))
}
