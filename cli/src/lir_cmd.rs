//! `xpuctl ir lir`: the LIR-ML the llvm engine makes of a program's llvm partitions, and
//! with `--emit` what LLVM makes of that (optimised IR or assembly for this machine).
//! `xpuctl build --target riscv64`: a whole program compiled ahead of time for a board;
//! `--target cuda`: its llvm partitions' kernels as CUDA C++ and PTX.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{Result, anyhow, bail};
use xpu_engine_llvm::{Emit, codegen, compile, lower};
use xpu_ir::Dim;

/// What to print for each partition.
#[derive(Copy, Clone, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum LirEmit {
    /// LIR-ML text.
    Lir,
    /// LLVM IR after `default<O3>` for this machine.
    LlvmIr,
    /// Assembly for this machine.
    Asm,
}

/// Without `--policy`: llvm first for whatever it takes, cpu for the rest.
const DEFAULT_POLICY: &str = r#"
[policy]
name = "ir-lir"
version = 1
description = "llvm first, cpu for the rest (xpuctl ir lir without --policy)"

[engines]
order = ["llvm", "cpu"]
fallback = "allow"
"#;

/// Boards `xpuctl build` compiles for.
#[derive(Copy, Clone, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum BuildTarget {
    /// rv64gc or rv64gcv (`--cpu`), lp64d: a static executable.
    Riscv64,
    /// CUDA C++ and PTX (NVRTC) for `--arch`.
    Cuda,
}

/// The program planned under `policy` (default: llvm first) on this process's engines.
fn planned(
    program: &Path,
    policy: Option<&str>,
    bind: &[String],
) -> Result<(xpu_plan::CapturePlan, BTreeMap<String, u64>)> {
    let policy = match policy {
        Some(p) => crate::policy_cmd::load_policy(Some(p), &[])?,
        None => xpu_policy::Loader::new()
            .load_text("built-in ir-lir policy", None, DEFAULT_POLICY)
            .map_err(|d| anyhow!("{d}"))?,
    };
    let graph = crate::program::load(program)?;
    let bindings = crate::policy_cmd::parse_bindings(bind)?;
    let inventory = crate::registry().inventory_for(&graph);
    let (plan, _) = xpu_runtime::plan_graph(&graph, &policy, &inventory, &bindings)
        .map_err(|f| anyhow!("the program does not plan: {f}"))?;
    Ok((plan, bindings))
}

pub fn build(
    program: &Path,
    policy: Option<&str>,
    bind: &[String],
    isa: xpu_engine::RiscvCpu,
    output: &Path,
) -> Result<()> {
    let (plan, bindings) = planned(program, policy, bind)?;
    let elsewhere: Vec<String> = plan
        .partitions
        .iter()
        .filter(|p| p.engine != "llvm")
        .flat_map(|p| p.nodes.iter().map(move |n| (n, &p.engine)))
        .filter(|(n, _)| plan.graph.node(**n).op != xpu_ir::Op::Constant)
        .map(|(n, e)| format!("{} on {e}", plan.graph.node(*n).label(*n)))
        .collect();
    if !elsewhere.is_empty() {
        bail!(
            "{}: a riscv64 build compiles the whole program with the llvm engine, but {} node(s) plan elsewhere: {}",
            program.display(),
            elsewhere.len(),
            elsewhere.join(", ")
        );
    }
    let shapes = concrete_shapes(&plan.graph, &bindings)?;
    let manifest = xpu_engine_llvm::riscv::build(&plan.graph, &shapes, output, isa)
        .map_err(|e| anyhow!("{}: {e}", program.display()))?;
    eprintln!(
        "wrote {} ({} kernel(s), {} {} {}; run it with {}/run --input NAME=FILE.npy ... --out DIR)",
        output.display(),
        manifest.kernels,
        manifest.isa,
        manifest.triple,
        manifest.abi,
        output.display()
    );
    Ok(())
}

/// Each partition the plan puts on llvm, as LIR-ML, rendered as CUDA C++ and compiled by
/// NVRTC for `arch`: `DIR/partitionN.cu`, `DIR/partitionN.ptx` and `DIR/manifest.json`
/// (program, arch, NVRTC version, per partition its nodes, kernels and files; partitions
/// on other engines listed as not generated; row groups merged into one kernel; the math
/// the engine would compile with under the policy's determinism — strict under `bitwise`,
/// FMA contraction and approximate division otherwise — named in the manifest). The cuda
/// engine runs such kernels; this makes them inspectable and checkable (ptxas) without a
/// GPU.
pub fn build_cuda(
    program: &Path,
    policy: Option<&str>,
    bind: &[String],
    arch: &str,
    output: &Path,
) -> Result<()> {
    use xpu_engine_cuda::{codegen as cuda, toolkit};
    toolkit::virtual_arch(arch)?;
    let nvrtc = toolkit::nvrtc(None).map_err(|e| anyhow!("a cuda build needs NVRTC: {e}"))?;
    let (plan, bindings) = planned(program, policy, bind)?;
    let math = toolkit::Math::for_determinism(plan.execution.determinism);
    std::fs::create_dir_all(output).map_err(|e| anyhow!("{}: {e}", output.display()))?;
    let mut partitions = Vec::new();
    let mut not_generated = Vec::new();
    for p in &plan.partitions {
        if p.engine != "llvm" {
            not_generated.push(serde_json::json!({ "partition": p.id, "engine": p.engine, "nodes": p.nodes.len() }));
            continue;
        }
        let part = plan.graph.partition(&p.nodes);
        let shapes = concrete_shapes(&part.graph, &bindings)?;
        let lowered = lower::lower(&part.graph, &shapes, &vec![None; shapes.len()])
            .map_err(|e| anyhow!("partition {}: {e}", p.id))?;
        // Row groups merged into one kernel, as the engine runs them.
        let lowered = xpu_engine_cuda::rows::merge_row_steps(lowered);
        let kernels: Vec<_> = lowered.steps.iter().map(|s| s.kernel.clone()).collect();
        let source = cuda::source(&kernels).map_err(|e| anyhow!("partition {}: {e}", p.id))?;
        let name = format!("partition{}", p.id);
        let ptx = toolkit::compile_ptx_with(&source, &name, arch, math)?;
        for (ext, text) in [("cu", &source), ("ptx", &ptx)] {
            let path = output.join(format!("{name}.{ext}"));
            std::fs::write(&path, text).map_err(|e| anyhow!("{}: {e}", path.display()))?;
        }
        partitions.push(serde_json::json!({
            "partition": p.id,
            "nodes": p.nodes.iter().map(|n| plan.graph.node(*n).label(*n)).collect::<Vec<_>>(),
            "kernels": kernels.iter().map(|k| k.name.clone()).collect::<Vec<_>>(),
            "source": format!("{name}.cu"),
            "ptx": format!("{name}.ptx"),
        }));
    }
    if partitions.is_empty() {
        bail!("no node of {} has a generated kernel under this policy", program.display());
    }
    let manifest = serde_json::json!({
        "program": program.display().to_string(),
        "target": "cuda",
        "arch": arch,
        "nvrtc": format!("{}.{}", nvrtc.version.0, nvrtc.version.1),
        "math": math.describe(),
        "partitions": partitions,
        "not_generated": not_generated,
    });
    let path = output.join("manifest.json");
    std::fs::write(&path, serde_json::to_string_pretty(&manifest)? + "\n")
        .map_err(|e| anyhow!("{}: {e}", path.display()))?;
    eprintln!(
        "wrote {} ({} partition(s) as CUDA C++ and PTX for {arch}, NVRTC {}.{}{})",
        output.display(),
        partitions.len(),
        nvrtc.version.0,
        nvrtc.version.1,
        if not_generated.is_empty() {
            String::new()
        } else {
            format!("; {} partition(s) on other engines not generated", not_generated.len())
        }
    );
    Ok(())
}

pub fn run(program: &Path, policy: Option<&str>, bind: &[String], emit: LirEmit) -> Result<()> {
    let (plan, bindings) = planned(program, policy, bind)?;
    let mut printed = 0;
    // What the engine would compile for (`$XPU_LLVM_HOST_CPU` holds it to a level); only
    // what LLVM makes of the LIR needs it.
    let host = match emit {
        LirEmit::Lir => None,
        LirEmit::LlvmIr | LirEmit::Asm => {
            Some(xpu_engine_llvm::host_target(None).map_err(|e| anyhow!("{e}"))?)
        }
    };
    for p in plan.partitions.iter().filter(|p| p.engine == "llvm") {
        let part = plan.graph.partition(&p.nodes);
        let shapes = concrete_shapes(&part.graph, &bindings)?;
        let lowered = lower::lower(&part.graph, &shapes, &vec![None; shapes.len()])
            .map_err(|e| anyhow!("partition {}: {e}", p.id))?;
        let module = lowered.module();
        println!("; partition {} ({} nodes on llvm)", p.id, p.nodes.len());
        match &host {
            None => print!("{module}"),
            Some(host) => {
                let (ir, _) = codegen::emit_module(&module.kernels, host.vector_bits())
                    .map_err(|e| anyhow!("{e}"))?;
                let what = if emit == LirEmit::Asm { Emit::Asm } else { Emit::OptimizedIr };
                let out = compile::compile(&ir, host, what).map_err(|e| anyhow!("{e}"))?;
                print!("{}", String::from_utf8_lossy(&out));
            }
        }
        printed += 1;
    }
    if printed == 0 {
        bail!("no node of {} runs on llvm under this policy", program.display());
    }
    Ok(())
}

/// The partition's input shapes with its symbols bound.
fn concrete_shapes(g: &xpu_ir::Graph, bindings: &BTreeMap<String, u64>) -> Result<Vec<Vec<usize>>> {
    g.inputs
        .iter()
        .map(|&v| {
            let name = g.value(v).name.clone().unwrap_or_else(|| v.to_string());
            let dims = g.ty(v).dims.as_ref().ok_or_else(|| anyhow!("input {name:?} has no known rank"))?;
            dims.iter()
                .map(|d| match d {
                    Dim::Known(n) => Ok(*n as usize),
                    Dim::Sym(s) => bindings.get(s).map(|n| *n as usize).ok_or_else(|| {
                        anyhow!("input {name:?} has symbolic dim {s}: give its size with --bind {s}=SIZE")
                    }),
                    Dim::Unknown => bail!("input {name:?} has a dim of unknown size"),
                })
                .collect()
        })
        .collect()
}
