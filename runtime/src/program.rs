//! Programs, from a file or from bytes with a name: `.onnx`, `.sgr` (SGR-ML text), `.json`
//! (SGR-ML JSON) or `.ml` (MiniLang: checked, then lowered to SGR-ML with its files read
//! inside the data roots). Every error names the program (and line:col where there is one).

use std::path::{Path, PathBuf};

use xpu_ir::Graph;
use xpu_minilang::lower::{Inputs, PrintItem};
use xpu_minilang::paths::DataRoots;

/// A program that does not load: unreadable, unparsable, ill-typed or invalid. The message
/// starts with the program's name and, for MiniLang, holds the rendered diagnostics.
#[derive(Debug, thiserror::Error)]
#[error("{name}{}{message}", if *.located { ":" } else { ": " })]
pub struct ProgramError {
    pub name: String,
    pub message: String,
    /// The message starts with `line:col:` (shown as `file:line:col: …`, as compilers do).
    pub located: bool,
}

fn err(name: &str, message: impl Into<String>) -> ProgramError {
    ProgramError { name: name.to_string(), message: message.into(), located: false }
}

fn err_at(name: &str, message: impl Into<String>) -> ProgramError {
    ProgramError { name: name.to_string(), message: message.into(), located: true }
}

/// The languages a program may be written in, known by the file extension.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum ProgramKind {
    MiniLang,
    SgrText,
    SgrJson,
    Onnx,
}

impl ProgramKind {
    /// The kind of a program called `name` (by its extension).
    pub fn of(name: &str) -> Option<ProgramKind> {
        let ext = Path::new(name).extension()?.to_str()?.to_ascii_lowercase();
        Some(match ext.as_str() {
            "ml" => ProgramKind::MiniLang,
            "sgr" => ProgramKind::SgrText,
            "json" => ProgramKind::SgrJson,
            "onnx" => ProgramKind::Onnx,
            _ => return None,
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            ProgramKind::MiniLang => "minilang",
            ProgramKind::SgrText => "sgr",
            ProgramKind::SgrJson => "sgr-json",
            ProgramKind::Onnx => "onnx",
        }
    }

    /// Whether the program is text worth keeping with its run (not a binary model).
    pub fn is_text(self) -> bool {
        self != ProgramKind::Onnx
    }
}

/// A loaded program: its graph and, for MiniLang, what its `print`s show and the files its
/// `write_npy`s target.
#[derive(Debug)]
pub struct Compiled {
    pub kind: ProgramKind,
    pub graph: Graph,
    pub prints: Vec<PrintItem>,
    pub writes: Vec<(String, PathBuf)>,
    /// Files a MiniLang program names (read or written). Empty for the other kinds, whose
    /// graph is a function of their bytes alone.
    pub files: Vec<PathBuf>,
}

/// Loads a program from its bytes. `name` gives the language (by extension) and names the
/// program in errors; a MiniLang program's files resolve inside `roots`, and `inputs`
/// types its `input(…)`s.
pub fn compile(
    name: &str,
    bytes: &[u8],
    roots: &DataRoots,
    inputs: &Inputs,
) -> Result<Compiled, ProgramError> {
    let Some(kind) = ProgramKind::of(name) else {
        let ext = Path::new(name).extension().and_then(|e| e.to_str()).unwrap_or("");
        return Err(err(
            name,
            format!("unknown program type `.{ext}` (expected .ml, .onnx, .sgr or .json)"),
        ));
    };
    let text = || std::str::from_utf8(bytes).map_err(|_| err(name, "not UTF-8 text"));
    let graph = match kind {
        ProgramKind::Onnx => xpu_onnx::import_model(bytes)
            .map_err(|e| err(name, format!("cannot import the ONNX model: {e}")))?,
        ProgramKind::SgrText => {
            xpu_ir::text::parse(text()?).map_err(|e| err_at(name, e.to_string()))?
        }
        ProgramKind::SgrJson => xpu_ir::from_json(text()?)
            .map_err(|e| err_at(name, format!("{}:{}: {e}", e.line(), e.column())))?,
        ProgramKind::MiniLang => return compile_minilang(name, text()?, roots, inputs),
    };
    let mut graph = graph;
    if let Err(errs) = xpu_ir::verify(&graph) {
        let list: Vec<String> = errs.iter().take(20).map(|e| format!("  {e}")).collect();
        return Err(err(
            name,
            format!("the graph is invalid ({} problem(s)):\n{}", errs.len(), list.join("\n")),
        ));
    }
    let files = confine_paths(name, &mut graph, roots)?;
    Ok(Compiled { kind, graph, prints: Vec::new(), writes: Vec::new(), files })
}

/// Confines every file a graph's nodes read or write to the data roots, as MiniLang's
/// compiler does for its programs: a path that leaves the roots (`..`, an absolute path
/// elsewhere, a symlink out) is refused naming the node; an accepted one is replaced by its
/// canonical form, so the engine opens exactly the file that was checked. Returns the files.
fn confine_paths(
    name: &str,
    graph: &mut Graph,
    roots: &DataRoots,
) -> Result<Vec<PathBuf>, ProgramError> {
    use xpu_ir::{Attr, Op};
    let mut files = Vec::new();
    for id in graph.node_ids().collect::<Vec<_>>() {
        let node = graph.node(id);
        let write = match node.op {
            Op::ReadCsv | Op::ReadXlsx | Op::ReadParquet => false,
            Op::WriteTable | Op::Plot => true,
            _ => continue,
        };
        let requested = node.attrs.str("path", "").to_string();
        let resolved =
            if write { roots.resolve_write(&requested) } else { roots.resolve_read(&requested) };
        let path = resolved
            .map_err(|m| err(name, format!("{}: `path`: {m}", graph.node(id).label(id))))?;
        graph.nodes[id.index()].attrs.set("path", Attr::Str(path.display().to_string()));
        files.push(path);
    }
    Ok(files)
}

fn compile_minilang(
    name: &str,
    text: &str,
    roots: &DataRoots,
    inputs: &Inputs,
) -> Result<Compiled, ProgramError> {
    let (program, diags) = xpu_minilang::analyze(text);
    let errors = diags.iter().filter(|d| d.is_error()).count();
    if errors > 0 {
        return Err(err(
            name,
            format!("{errors} error(s):\n{}", xpu_minilang::render(name, text, &diags)),
        ));
    }
    let stem = Path::new(name)
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| "program".into());
    let mut inputs = inputs.clone();
    inputs.models.get_or_insert_with(model_loader);
    inputs.tables.get_or_insert_with(|| table_loader(roots.roots()));
    let lowered = xpu_minilang::lower::lower_with(&program, &stem, Some(roots), &inputs).map_err(
        |diags| {
            err(
                name,
                format!("{} error(s):\n{}", diags.len(), xpu_minilang::render(name, text, &diags)),
            )
        },
    )?;
    if let Err(errs) = xpu_ir::verify(&lowered.graph) {
        return Err(err(
            name,
            format!("internal error: the lowered graph is invalid: {}", errs[0]),
        ));
    }
    Ok(Compiled {
        kind: ProgramKind::MiniLang,
        graph: lowered.graph,
        prints: lowered.prints,
        writes: lowered.writes,
        files: lowered.files,
    })
}

/// Reads and loads a program file; a MiniLang program's files resolve in
/// [`data_roots_of`] the file.
pub fn load_file(path: &Path, inputs: &Inputs) -> Result<Compiled, ProgramError> {
    let name = path.display().to_string();
    let bytes = std::fs::read(path).map_err(|e| err(&name, format!("cannot read: {e}")))?;
    compile(&name, &bytes, &data_roots_of(path), inputs)
}

/// Reads a program file and returns its verified graph.
pub fn load(path: &Path) -> Result<Graph, ProgramError> {
    load_file(path, &Inputs::default()).map(|c| c.graph)
}

/// The data roots of a program run from the command line: the working directory and the
/// program's own directory.
pub fn data_roots_of(program: &Path) -> DataRoots {
    DataRoots::new([
        std::env::current_dir().unwrap_or_else(|_| ".".into()),
        program
            .parent()
            .map(Path::to_path_buf)
            .filter(|p| !p.as_os_str().is_empty())
            .unwrap_or_else(|| ".".into()),
    ])
}

/// How MiniLang's `model("…")` reads a model (its path already resolved inside the roots):
/// any program file (.onnx, .sgr, .json), verified.
pub fn model_loader() -> xpu_minilang::lower::ModelLoader {
    std::sync::Arc::new(|p: &Path| load(p).map_err(|e| e.to_string()))
}

/// How MiniLang learns a table file's columns at compile time: the table engine's own reader
/// (DuckDB's CSV sniffer, the Parquet footer, calamine), confined to the data roots.
pub fn table_loader(roots: &[PathBuf]) -> xpu_minilang::lower::TableSchemaLoader {
    let engine = xpu_engine_table::TableEngine::new(roots.to_vec());
    std::sync::Arc::new(move |op, attrs| engine.source_schema(op, attrs))
}
