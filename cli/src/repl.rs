//! `xpuctl repl`: MiniLang interactively. Accepted lines accumulate into one program; each new
//! input is checked and lowered together with them, run, and only its own prints are shown
//! (a bare expression prints its value). Input continues over several lines while brackets
//! or braces are open. Commands: `:ir`, `:type EXPR`, `:ask QUESTION`, `:help`, `:quit`. Line editing and
//! history come from rustyline on a terminal; piped input is read line by line.

use std::io::{BufRead, IsTerminal, Write};

use anyhow::Result;
use xpu_minilang::lower::{Lowered, PrintItem};

const HELP: &str = "MiniLang REPL. Statements accumulate; a bare expression prints its value.
  :ir          the SGR-ML graph of the session
  :type EXPR   the type of an expression (tensor dtype and shape, or a compile-time value)
  :ask Q       a program for the question from the LLM of XPU_ASK_ENDPOINT / XPU_ASK_MODEL
               (docs/ask.md), checked and dry-run on the files the session reads, then run
  :help        this text
  :quit        leave (also Ctrl-D)";

struct Session {
    accepted: String,
    shown_prints: usize,
    roots: xpu_minilang::paths::DataRoots,
    /// Made once per session: every input is lowered again, and each lowering reads table
    /// schemas through it.
    inputs: xpu_minilang::lower::Inputs,
}

/// Whether the input still has an open `(`, `[` or `{` (outside strings and comments).
fn open_brackets(src: &str) -> bool {
    let mut depth = 0i32;
    let mut in_str = false;
    let mut chars = src.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' if in_str => {
                chars.next();
            }
            '"' => in_str = !in_str,
            '#' if !in_str => {
                for c in chars.by_ref() {
                    if c == '\n' {
                        break;
                    }
                }
            }
            '(' | '[' | '{' if !in_str => depth += 1,
            ')' | ']' | '}' if !in_str => depth -= 1,
            _ => {}
        }
    }
    depth > 0
}

impl Session {
    fn lower(&self, src: &str) -> std::result::Result<Lowered, String> {
        let (program, diags) = xpu_minilang::analyze(src);
        if diags.iter().any(|d| d.is_error()) {
            return Err(xpu_minilang::render("<repl>", src, &diags));
        }
        xpu_minilang::lower::lower_with(&program, "repl", Some(&self.roots), &self.inputs)
            .map_err(|d| xpu_minilang::render("<repl>", src, &d))
    }

    /// Plans the lowered program under the default policy (tables on the table engine,
    /// tensors on the CPU) and runs it.
    fn run(&self, lowered: &Lowered) -> Result<Vec<xpu_ir::Tensor>> {
        crate::run_default(lowered.graph.clone(), self.roots.roots())
    }

    fn input(&mut self, text: &str, out: &mut impl Write) -> Result<()> {
        let trimmed = text.trim();
        if let Some(expr) = trimmed.strip_prefix(":type") {
            let src = format!("{}\nprint ({})\n", self.accepted, expr.trim());
            match self.lower(&src) {
                Err(e) => write!(out, "{e}")?,
                Ok(l) => match l.prints.last() {
                    Some(PrintItem::Output(name)) => {
                        let o = l.graph.outputs.iter().find(|o| &o.name == name).expect("output");
                        match &l.types.get(name) {
                            Some(t) => writeln!(out, "{t}")?,
                            None => writeln!(out, "tensor {}", l.graph.ty(o.value))?,
                        }
                    }
                    Some(PrintItem::Text(t)) => writeln!(out, "compile-time value {t}")?,
                    None => writeln!(out, "no value")?,
                },
            }
            return Ok(());
        }
        if trimmed == ":ir" {
            match self.lower(&self.accepted) {
                Ok(l) => write!(out, "{}", xpu_ir::text::print(&l.graph))?,
                Err(e) => write!(out, "{e}")?,
            }
            return Ok(());
        }
        if let Some(question) = trimmed.strip_prefix(":ask") {
            let question = question.trim();
            if question.is_empty() {
                writeln!(out, "usage: :ask QUESTION")?;
                return Ok(());
            }
            match crate::ask_cmd::ask_in_repl(question, &self.accepted, out) {
                Ok(Some((program, writes))) => {
                    writeln!(out, "{}", program.trim_end())?;
                    // A program that writes files (or whose writes are unknown) is shown,
                    // not run: the user decides.
                    let why = match &writes {
                        None => Some("what it writes is unknown".to_string()),
                        Some(w) if !w.is_empty() => {
                            Some(format!("it writes files ({})", w.join(", ")))
                        }
                        Some(_) => None,
                    };
                    if let Some(why) = why {
                        writeln!(out, "not run: {why}; enter it yourself to run it")?;
                        return Ok(());
                    }
                    return self.input(&program, out);
                }
                Ok(None) => return Ok(()),
                Err(e) => {
                    writeln!(out, "error: {e:#}")?;
                    return Ok(());
                }
            }
        }
        if trimmed == ":help" {
            writeln!(out, "{HELP}")?;
            return Ok(());
        }
        if trimmed.starts_with(':') {
            writeln!(out, "unknown command {trimmed} (:help lists them)")?;
            return Ok(());
        }
        // A bare expression prints its value.
        let (parsed, _) = xpu_minilang::parser::parse(trimmed);
        let snippet = match parsed.stmts.as_slice() {
            [s] if matches!(s.kind, xpu_minilang::ast::StmtKind::Expr(_)) => {
                format!("print ({trimmed})")
            }
            _ => trimmed.to_string(),
        };
        let candidate = format!("{}{snippet}\n", self.accepted);
        let lowered = match self.lower(&candidate) {
            Ok(l) => l,
            Err(e) => {
                write!(out, "{e}")?;
                return Ok(());
            }
        };
        let outputs = match self.run(&lowered) {
            Ok(o) => o,
            Err(e) => {
                writeln!(out, "error: {e:#}")?;
                return Ok(());
            }
        };
        for item in &lowered.prints[self.shown_prints.min(lowered.prints.len())..] {
            match item {
                PrintItem::Text(t) => writeln!(out, "{t}")?,
                PrintItem::Output(name) => {
                    let i =
                        lowered.graph.outputs.iter().position(|o| &o.name == name).expect("output");
                    writeln!(out, "{}", xpu_runtime::tensors::pretty(&outputs[i]))?;
                }
            }
        }
        self.shown_prints = lowered.prints.len();
        self.accepted = candidate;
        Ok(())
    }
}

pub fn repl() -> Result<()> {
    let cwd = std::env::current_dir().unwrap_or_else(|_| ".".into());
    let roots = xpu_minilang::paths::DataRoots::new([cwd]);
    let inputs = xpu_minilang::lower::Inputs {
        tables: Some(xpu_runtime::program::table_loader(roots.roots())),
        ..Default::default()
    };
    let mut session = Session { accepted: String::new(), shown_prints: 0, roots, inputs };
    let mut stdout = std::io::stdout();
    if !std::io::stdin().is_terminal() {
        // Piped input: no prompts, a statement may still span lines while brackets are open.
        let mut pending = String::new();
        for line in std::io::stdin().lock().lines() {
            let line = line?;
            pending.push_str(&line);
            pending.push('\n');
            if open_brackets(&pending) {
                continue;
            }
            if pending.trim() == ":quit" {
                pending.clear();
                break;
            }
            session.input(&pending, &mut stdout)?;
            pending.clear();
        }
        if !pending.trim().is_empty() {
            session.input(&pending, &mut stdout)?;
        }
        return Ok(());
    }
    let mut rl = rustyline::DefaultEditor::new()?;
    println!("MiniLang REPL (:help for commands, Ctrl-D to leave)");
    let mut pending = String::new();
    loop {
        let prompt = if pending.is_empty() { "ml> " } else { "... " };
        match rl.readline(prompt) {
            Ok(line) => {
                pending.push_str(&line);
                pending.push('\n');
                if open_brackets(&pending) {
                    continue;
                }
                let _ = rl.add_history_entry(pending.trim_end());
                if pending.trim() == ":quit" {
                    break;
                }
                session.input(&pending, &mut stdout)?;
                pending.clear();
            }
            Err(rustyline::error::ReadlineError::Interrupted) => pending.clear(),
            Err(rustyline::error::ReadlineError::Eof) => break,
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}
