//! riscv64 builds: a lowered program compiled ahead of time for `riscv64-unknown-linux-gnu`
//! (rv64gc, or rv64gcv whose loops use RVV 1.0's scalable vectors; lp64d), linked with a small C runtime (`runtime.c`: .npy in and
//! out, the kernels called in order) by the riscv64 cross gcc into one static executable.
//! The directory it is written to holds `program`, `manifest.json` (inputs, outputs,
//! dtypes, shapes, the code's hash, compiler versions) and `run`, which runs the program
//! natively on a riscv64 board and under `qemu-riscv64` (or `$XPU_RISCV_RUNNER`) anywhere
//! else.

use std::fmt::Write;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde::{Deserialize, Serialize};
use xpu_engine::RiscvCpu;
use xpu_ir::{DType, Graph};

use crate::codegen;
use crate::compile::{self, Emit, Target};
use crate::lower::{self, Program, Slot};

pub mod device;
pub mod npy;

pub(crate) const RUNTIME_C: &str = include_str!("runtime.c");
const PROGRAM_H: &str = include_str!("program.h");

/// Why a build failed, naming what.
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    #[error("{0}")]
    Lower(#[from] lower::LowerError),
    #[error("{0}")]
    Codegen(#[from] codegen::CodegenError),
    #[error("{0}")]
    Compile(#[from] compile::CompileError),
    #[error("{what}: {message}")]
    Unsupported { what: String, message: String },
    #[error("the riscv64 cross compiler: {0}")]
    Toolchain(String),
    #[error("{path}: {message}")]
    Io { path: String, message: String },
}

/// One input or output of a build.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct TensorSpec {
    pub name: String,
    pub dtype: String,
    pub shape: Vec<usize>,
}

/// What `manifest.json` says.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Manifest {
    pub program: String,
    /// The ISA the code needs (`rv64gc`, `rv64gcv`): a board must implement it.
    pub isa: RiscvCpu,
    pub triple: String,
    pub cpu: String,
    pub features: String,
    pub abi: String,
    pub inputs: Vec<TensorSpec>,
    pub outputs: Vec<TensorSpec>,
    pub kernels: usize,
    /// sha-256 of the LIR-ML text the kernels were compiled from.
    pub lir_hash: String,
    pub llvm: String,
    pub cc: String,
}

/// The riscv64 cross compiler, found once: its driver and its `--version` line
/// (manifests, cache keys), asked for the first time a build needs it — finding the
/// driver is enough to say the device is available, and running it costs every process
/// that only plans (an `xpuctl run`) a few milliseconds.
#[derive(Clone, Debug)]
pub struct Toolchain {
    pub cc: PathBuf,
    version: std::sync::OnceLock<String>,
}

impl Toolchain {
    pub fn find() -> Result<Toolchain, String> {
        Ok(Toolchain { cc: cross_cc()?, version: std::sync::OnceLock::new() })
    }

    /// The driver's `--version` first line (empty if it prints none).
    pub fn version(&self) -> &str {
        self.version.get_or_init(|| version_line(&self.cc))
    }
}

/// The riscv64 cross C compiler driver: `$XPU_RISCV_CC`, else `riscv64-linux-gnu-gcc`.
pub fn cross_cc() -> Result<PathBuf, String> {
    if let Some(p) = std::env::var_os("XPU_RISCV_CC") {
        return Ok(PathBuf::from(p));
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .map(|d| d.join("riscv64-linux-gnu-gcc"))
        .find(|p| p.is_file())
        .ok_or_else(|| "riscv64-linux-gnu-gcc is not on PATH (Debian gcc-riscv64-linux-gnu; `make setup` installs it) and XPU_RISCV_CC is unset".into())
}

/// The numpy type string of a dtype the runtime reads and writes.
pub(crate) fn descr(d: DType) -> Option<&'static str> {
    Some(match d {
        DType::F32 => "<f4",
        DType::F64 => "<f8",
        DType::F16 => "<f2",
        DType::I32 => "<i4",
        DType::I64 => "<i8",
        DType::Bool => "|b1",
        _ => return None,
    })
}

/// Names become file names on the board (`OUT/<name>.npy`) and C strings: plain ones only.
fn check_name(kind: &str, name: &str) -> Result<(), BuildError> {
    let ok = !name.is_empty()
        && name.len() <= 128
        && !name.starts_with('.')
        && name.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'));
    if ok {
        Ok(())
    } else {
        Err(BuildError::Unsupported {
            what: format!("{kind} {name:?}"),
            message: "names of a riscv64 build's inputs and outputs are letters, digits, `_`, `-` and `.` (they become file names)".into(),
        })
    }
}

fn io(path: &Path) -> impl Fn(std::io::Error) -> BuildError + '_ {
    move |e| BuildError::Io { path: path.display().to_string(), message: e.to_string() }
}

/// How a build names its inputs and outputs.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Names {
    /// The graph's names (what a user passes to `run --input NAME=…`).
    Graph,
    /// `i0, i1, …` and `o0, o1, …` (partitions, whose values need not be named).
    Positional,
}

/// Lowers `g` for inputs of `shapes`, compiles it for riscv64 and writes the build into
/// `dir` (created if missing), named as the graph names its inputs and outputs.
pub fn build(
    g: &Graph,
    shapes: &[Vec<usize>],
    dir: &Path,
    isa: RiscvCpu,
) -> Result<Manifest, BuildError> {
    let toolchain = Toolchain::find().map_err(BuildError::Toolchain)?;
    build_named(g, shapes, &vec![None; shapes.len()], dir, isa, Names::Graph, &toolchain)
}

/// [`build`] with the values of the structural inputs (`lower::structural_inputs`: a
/// reduction's axes given as an input; `None` elsewhere) and the naming chosen.
pub fn build_named(
    g: &Graph,
    shapes: &[Vec<usize>],
    structural: &[Option<Vec<i64>>],
    dir: &Path,
    isa: RiscvCpu,
    names: Names,
    toolchain: &Toolchain,
) -> Result<Manifest, BuildError> {
    let cc = &toolchain.cc;
    let program = lower::lower(g, shapes, structural)?;
    let module = program.module();
    xpu_lir::verify(&module).map_err(|e| BuildError::Unsupported {
        what: "the lowering".into(),
        message: e.to_string(),
    })?;
    let target = Target::riscv64(isa);
    let (ir, stages) = codegen::emit_module(&module.kernels, target.vector_bits())?;
    let object = compile::compile(&ir, &target, Emit::Object)?;
    std::fs::create_dir_all(dir).map_err(io(dir))?;
    // The compiler runs in a scratch directory: a relative `dir` must not resolve there.
    let dir = &std::path::absolute(dir).map_err(io(dir))?;
    let named = |given: Option<String>, prefix: &str, i: usize| match names {
        Names::Graph => given.unwrap_or_default(),
        Names::Positional => format!("{prefix}{i}"),
    };
    let inputs = specs(
        g,
        g.inputs.iter().enumerate().map(|(i, &v)| (named(g.value(v).name.clone(), "i", i), v)),
        shapes,
        &program,
        true,
    )?;
    let outputs = specs(
        g,
        g.outputs.iter().enumerate().map(|(i, o)| (named(Some(o.name.clone()), "o", i), o.value)),
        shapes,
        &program,
        false,
    )?;
    let program_c = program_c(g, &program, &stages, &inputs, &outputs)?;
    let work = tempfile::tempdir_in(dir).map_err(io(dir))?;
    for (name, text) in
        [("runtime.c", RUNTIME_C), ("program.h", PROGRAM_H), ("program.c", program_c.as_str())]
    {
        let p = work.path().join(name);
        std::fs::write(&p, text).map_err(io(&p))?;
    }
    let obj = work.path().join("kernels.o");
    std::fs::write(&obj, &object).map_err(io(&obj))?;
    let max_buffers = program.steps.iter().map(|s| s.buffers.len()).max().unwrap_or(0);
    let exe = dir.join("program");
    let out = Command::new(cc)
        .current_dir(work.path())
        .args(["-O2", "-static", "-std=c11", "-march=rv64gc", "-mabi=lp64d"])
        .arg(format!("-DXPU_INPUTS={}", inputs.len()))
        .arg(format!("-DXPU_VALUES={}", program.values.len()))
        .arg(format!("-DXPU_STEPS={}", program.steps.len()))
        .arg(format!("-DXPU_OUTPUTS={}", outputs.len()))
        .arg(format!("-DXPU_MAX_BUFFERS={max_buffers}"))
        .arg(format!("-DXPU_RVV={}", u8::from(isa.has_vector())))
        .args(["runtime.c", "program.c", "kernels.o", "-lm", "-o"])
        .arg(&exe)
        .output()
        .map_err(|e| BuildError::Toolchain(format!("{}: {e}", cc.display())))?;
    if !out.status.success() {
        return Err(BuildError::Toolchain(format!(
            "{} exited with {}: {}",
            cc.display(),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    let run = dir.join("run");
    std::fs::write(&run, run_script(isa)).map_err(io(&run))?;
    set_executable(&run)?;
    let manifest = Manifest {
        program: g.name.clone(),
        isa,
        triple: target.triple.clone(),
        cpu: target.cpu.clone(),
        features: target.features.clone(),
        abi: target.abi.clone().unwrap_or_default(),
        inputs,
        outputs,
        kernels: module.kernels.len(),
        lir_hash: {
            use sha2::{Digest, Sha256};
            Sha256::digest(module.to_string().as_bytes())
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect()
        },
        llvm: compile::llvm_version(),
        cc: toolchain.version().to_string(),
    };
    let path = dir.join("manifest.json");
    let json = serde_json::to_string_pretty(&manifest)
        .map_err(|e| BuildError::Io { path: path.display().to_string(), message: e.to_string() })?;
    std::fs::write(&path, json + "\n").map_err(io(&path))?;
    Ok(manifest)
}

const RUN_SH: &str = r#"#!/bin/sh
# Runs this xpu riscv64 build: natively on a riscv64 board, under qemu-riscv64 (or
# $XPU_RISCV_RUNNER) anywhere else.   run --input NAME=FILE.npy ... --out DIR
here=$(dirname "$0")
case "$(uname -m)" in
  riscv64) exec "$here/program" "$@" ;;
  *) exec ${XPU_RISCV_RUNNER:-qemu-riscv64} "$here/program" "$@" ;;
esac
"#;

/// qemu's options for a CPU with RVV 1.0 (qemu 7.2's default riscv64 CPU, Debian 12's, has
/// none); the vector length is qemu's default, 128 bits, unless `vlen=` is added.
pub const QEMU_RVV_CPU: &str = "rv64,v=true,vext_spec=v1.0";

/// The build's `run` script. A vector build uses RVV 1.0 instructions, which qemu's default
/// CPU may lack (7.2's does: the program would refuse to start), so the default runner asks
/// for a CPU with the extension.
fn run_script(isa: RiscvCpu) -> String {
    if isa.has_vector() {
        RUN_SH.replace("qemu-riscv64}", &format!("qemu-riscv64 -cpu {QEMU_RVV_CPU}}}"))
    } else {
        RUN_SH.to_string()
    }
}

fn set_executable(path: &Path) -> Result<(), BuildError> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).map_err(io(path))
}

/// The C compiler driver's `--version` first line.
fn version_line(cc: &Path) -> String {
    Command::new(cc)
        .arg("--version")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.lines().next().map(str::to_string))
        .unwrap_or_default()
}

/// The specs of graph inputs (`inputs`: shapes given) or outputs (shapes from the program).
fn specs(
    g: &Graph,
    values: impl Iterator<Item = (String, xpu_ir::ValueId)>,
    shapes: &[Vec<usize>],
    program: &Program,
    inputs: bool,
) -> Result<Vec<TensorSpec>, BuildError> {
    values
        .enumerate()
        .map(|(i, (name, v))| {
            let kind = if inputs { "input" } else { "output" };
            check_name(kind, &name)?;
            let dtype = g.ty(v).dtype;
            descr(dtype).ok_or_else(|| BuildError::Unsupported {
                what: format!("{kind} {name:?}"),
                message: format!("dtype {dtype} has no .npy form the riscv64 runtime reads"),
            })?;
            let shape = if inputs {
                shapes[i].clone()
            } else {
                slot_shape(&program.outputs[i], shapes, program)
            };
            Ok(TensorSpec { name, dtype: dtype.to_string(), shape })
        })
        .collect()
}

fn slot_shape(slot: &Slot, shapes: &[Vec<usize>], program: &Program) -> Vec<usize> {
    match slot {
        Slot::Input(i) => shapes[*i].clone(),
        Slot::Constant(t) => t.shape().to_vec(),
        Slot::Computed(v) => program.values[*v].shape.clone(),
    }
}

/// A C string literal: every byte outside `[A-Za-z0-9_.-]` as an octal escape.
fn c_string(s: &str) -> String {
    let mut out = String::from("\"");
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-') {
            out.push(b as char);
        } else {
            let _ = write!(out, "\\{b:03o}");
        }
    }
    out.push('"');
    out
}

fn c_slot(slot: &Slot, consts: &mut Vec<xpu_ir::Tensor>) -> String {
    match slot {
        Slot::Input(i) => format!("{{XPU_INPUT, {i}}}"),
        Slot::Computed(v) => format!("{{XPU_VALUE, {v}}}"),
        Slot::Constant(t) => {
            consts.push(t.clone());
            format!("{{XPU_CONST, {}}}", consts.len() - 1)
        }
    }
}

fn c_tensor(name: &str, dtype: DType, shape: &[usize], shape_var: &str) -> String {
    format!(
        "{{{}, \"{}\", {}, {}, {shape_var}}}",
        c_string(name),
        descr(dtype).unwrap_or("|u1"),
        dtype.size_bytes(),
        shape.len()
    )
}

fn c_shape(var: &str, shape: &[usize]) -> String {
    let dims: Vec<String> = shape.iter().map(|d| d.to_string()).collect();
    format!(
        "static const int64_t {var}[] = {{{}0}};\n",
        dims.iter().map(|d| format!("{d}, ")).collect::<String>()
    )
}

/// The program's tables for `runtime.c`.
fn program_c(
    g: &Graph,
    program: &Program,
    stages: &[Vec<codegen::Stage>],
    inputs: &[TensorSpec],
    outputs: &[TensorSpec],
) -> Result<String, BuildError> {
    let mut c = String::from(
        "/* generated by xpu: the tables of one riscv64 build */\n#include \"program.h\"\n\n",
    );
    let mut consts = Vec::new();
    for list in stages {
        for s in list {
            let _ = writeln!(
                c,
                "extern void {}(void **, const int64_t *, int64_t, int64_t);",
                s.symbol
            );
        }
    }
    let mut steps = Vec::new();
    for (k, (step, list)) in program.steps.iter().zip(stages).enumerate() {
        let st = list
            .iter()
            .map(|s| {
                let (lo, hi) = s
                    .constant_range()
                    .map_err(|message| BuildError::Unsupported {
                        what: "a kernel".into(),
                        message,
                    })?
                    .unwrap_or((0, 0));
                Ok(format!("{{{}, {lo}, {hi}}}", s.symbol))
            })
            .collect::<Result<Vec<String>, BuildError>>()?;
        let _ = writeln!(c, "static const struct xpu_stage stages{k}[] = {{{}}};", st.join(", "));
        let slots: Vec<String> = step.buffers.iter().map(|sl| c_slot(sl, &mut consts)).collect();
        let _ = writeln!(c, "static const struct xpu_slot slots{k}[] = {{{}}};", slots.join(", "));
        steps.push(format!("{{{}, stages{k}, {}, slots{k}}}", st.len(), slots.len()));
    }
    let _ = writeln!(c, "const struct xpu_step xpu_steps[] = {{{}}};\n", steps.join(",\n  "));
    let mut table = Vec::new();
    for (i, spec) in inputs.iter().enumerate() {
        c.push_str(&c_shape(&format!("in_shape{i}"), &spec.shape));
        table.push(c_tensor(
            &spec.name,
            g.ty(g.inputs[i]).dtype,
            &spec.shape,
            &format!("in_shape{i}"),
        ));
    }
    let _ = writeln!(c, "const struct xpu_tensor xpu_inputs[] = {{{}}};\n", pad(&table));
    let mut table = Vec::new();
    for (i, v) in program.values.iter().enumerate() {
        c.push_str(&c_shape(&format!("value_shape{i}"), &v.shape));
        table.push(c_tensor(&format!("v{i}"), v.dtype, &v.shape, &format!("value_shape{i}")));
    }
    let _ = writeln!(c, "const struct xpu_tensor xpu_values[] = {{{}}};\n", pad(&table));
    let mut table = Vec::new();
    for (i, (spec, slot)) in outputs.iter().zip(&program.outputs).enumerate() {
        c.push_str(&c_shape(&format!("out_shape{i}"), &spec.shape));
        let dtype = g.ty(g.outputs[i].value).dtype;
        table.push(format!(
            "{{{}, {}}}",
            c_tensor(&spec.name, dtype, &spec.shape, &format!("out_shape{i}")),
            c_slot(slot, &mut consts)
        ));
    }
    let _ = writeln!(c, "const struct xpu_output xpu_outputs[] = {{{}}};\n", pad(&table));
    let mut table = Vec::new();
    for (i, t) in consts.iter().enumerate() {
        let bytes = t.le_bytes();
        let body: Vec<String> = bytes.iter().map(|b| b.to_string()).collect();
        let _ = writeln!(
            c,
            "static const unsigned char const{i}[] __attribute__((aligned(16))) = {{{}0}};",
            body.iter().map(|b| format!("{b},")).collect::<String>()
        );
        table.push(format!("const{i}"));
    }
    let _ = writeln!(c, "const unsigned char *const xpu_consts[] = {{{}}};", pad(&table));
    Ok(c)
}

/// A C initializer list that is never empty (C11 forbids `{}`).
fn pad(items: &[String]) -> String {
    if items.is_empty() { "0".into() } else { items.join(",\n  ") }
}
