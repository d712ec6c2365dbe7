//! LLVM IR text → optimised machine code for a target: the host CPU (its name *and* its
//! feature string, so a CPU whose AVX-512 is masked by the hypervisor never gets it) or
//! riscv64 (rv64gc, lp64d). The new pass manager runs `default<O3>` with loop and SLP
//! vectorisation on. LLVM is used from one thread at a time per context; everything it
//! creates is dropped before returning, so nothing LLVM-owned crosses threads.

use std::sync::Once;

use xpu_engine::{HostCpu, RiscvCpu};

use inkwell::OptimizationLevel;
use inkwell::context::Context;
use inkwell::memory_buffer::MemoryBuffer;
use inkwell::passes::PassBuilderOptions;
use inkwell::targets::{
    CodeModel, FileType, InitializationConfig, RelocMode, Target as LlvmTarget, TargetMachine,
    TargetMachineOptions, TargetTriple,
};

/// Where generated code runs.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Target {
    pub triple: String,
    pub cpu: String,
    pub features: String,
    /// The ABI name, where the triple alone does not fix it (`lp64d` on riscv64).
    pub abi: Option<String>,
}

impl Target {
    /// This machine, as LLVM detects it.
    pub fn host() -> Target {
        init();
        Target {
            triple: TargetMachine::get_default_triple().as_str().to_string_lossy().into_owned(),
            cpu: TargetMachine::get_host_cpu_name().to_string(),
            features: wide_vectors(TargetMachine::get_host_cpu_features().to_string()),
            abi: None,
        }
    }

    /// Code for this machine held to `cpu`'s instruction set: [`Target::host`] for
    /// `native`, else the x86-64 level's generic CPU and exactly its features — refused,
    /// naming what is missing, where the host lacks any of them (the code would stop on an
    /// illegal instruction) or is not x86-64.
    pub fn host_for(cpu: HostCpu) -> Result<Target, String> {
        Target::host().held_to(cpu)
    }

    /// This (host) target held to `cpu` ([`Target::host_for`]).
    fn held_to(self, cpu: HostCpu) -> Result<Target, String> {
        if cpu == HostCpu::Native {
            return Ok(self);
        }
        if !self.triple.starts_with("x86_64") {
            return Err(format!("{cpu} is an x86-64 level; this host is {}", self.triple));
        }
        let has = |f: &str| self.features.split(',').any(|x| x.strip_prefix('+') == Some(f));
        let wanted = cpu.x86_features();
        let mut missing: Vec<&str> = wanted.iter().copied().filter(|f| !has(f)).collect();
        // LLVM's x86-64-v4 CPU implies 512-bit registers (`evex512`); a host whose AVX-512
        // stops at 256 bits (AVX10/256) reports `-evex512` and must not get them.
        if cpu == HostCpu::X86_64V4 && self.features.split(',').any(|f| f == "-evex512") {
            missing.push("evex512");
        }
        if !missing.is_empty() {
            return Err(format!("{cpu}: this host ({}) lacks {}", self.cpu, missing.join(", ")));
        }
        let features = wanted.iter().map(|f| format!("+{f}")).collect::<Vec<_>>().join(",");
        Ok(Target { cpu: cpu.name().to_string(), features: wide_vectors(features), ..self })
    }

    /// The widest vector the loop vectoriser uses for this target, in bits: 512 on an
    /// AVX-512 host (see [`wide_vectors`]), 256 with AVX, 128 otherwise (SSE; riscv64,
    /// whose RVV width is not known at compile time).
    pub fn vector_bits(&self) -> u32 {
        let has = |f: &str| self.features.split(',').any(|x| x == f);
        if has("+avx512f") && has("-prefer-256-bit") {
            512
        } else if has("+avx") {
            256
        } else {
            128
        }
    }

    /// A riscv64 Linux board with `cpu`'s ISA (rv64gc, or rv64gcv with RVV 1.0, whose loops
    /// LLVM vectorises with scalable vectors) and the lp64d ABI.
    pub fn riscv64(cpu: RiscvCpu) -> Target {
        Target {
            triple: "riscv64-unknown-linux-gnu".into(),
            cpu: "generic-rv64".into(),
            features: cpu.llvm_features().into(),
            abi: Some("lp64d".into()),
        }
    }
}

/// LLVM tunes the Intel server cores with AVX-512 to prefer 256-bit vectors (older ones
/// slowed their clock for 512-bit work). The kernels this engine compiles are long
/// arithmetic loops where a 512-bit vector does twice the work per instruction: softplus
/// ran 1.57× faster per element with them on a Xeon with AVX-512 (Sapphire Rapids class),
/// so a host with AVX-512 gets `-prefer-256-bit`. Results are the same lane by lane; only
/// reductions allowed to reassociate (not under `determinism = "bitwise"`) change order.
fn wide_vectors(features: String) -> String {
    if features.split(',').any(|f| f == "+avx512f") {
        format!("{features},-prefer-256-bit")
    } else {
        features
    }
}

/// What to make of the IR.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Emit {
    /// A relocatable object (ELF).
    Object,
    /// Assembly text.
    Asm,
    /// The optimised IR, as text.
    OptimizedIr,
}

/// LLVM refused the IR or the target.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CompileError {
    #[error("LLVM could not parse the generated IR: {0}")]
    Parse(String),
    #[error("the generated IR does not verify: {0}")]
    Verify(String),
    #[error("LLVM has no target for {triple}: {message}")]
    Target { triple: String, message: String },
    #[error("LLVM's optimiser failed: {0}")]
    Passes(String),
    #[error("LLVM could not emit code: {0}")]
    Emit(String),
}

fn init() {
    static INIT: Once = Once::new();
    INIT.call_once(|| {
        let config = InitializationConfig::default();
        LlvmTarget::initialize_x86(&config);
        LlvmTarget::initialize_riscv(&config);
    });
}

/// The LLVM version this engine is linked against, as `major.minor.patch`.
pub fn llvm_version() -> String {
    let (a, b, c) = inkwell::support::get_llvm_version();
    format!("{a}.{b}.{c}")
}

fn machine(target: &Target) -> Result<TargetMachine, CompileError> {
    init();
    let triple = TargetTriple::create(&target.triple);
    let llvm_target = LlvmTarget::from_triple(&triple).map_err(|e| CompileError::Target {
        triple: target.triple.clone(),
        message: e.to_string(),
    })?;
    let mut options = TargetMachineOptions::default()
        .set_cpu(&target.cpu)
        .set_features(&target.features)
        .set_level(OptimizationLevel::Aggressive)
        .set_reloc_mode(RelocMode::PIC)
        .set_code_model(CodeModel::Default);
    if let Some(abi) = &target.abi {
        options = options.set_abi(abi);
    }
    llvm_target.create_target_machine_from_options(&triple, options).ok_or_else(|| {
        CompileError::Target {
            triple: target.triple.clone(),
            message: format!("no machine for cpu {} with features {}", target.cpu, target.features),
        }
    })
}

/// Parses, verifies and optimises `ir` for `target`, then emits `what`.
pub fn compile(ir: &str, target: &Target, what: Emit) -> Result<Vec<u8>, CompileError> {
    let tm = machine(target)?;
    let context = Context::create();
    let buffer = MemoryBuffer::create_from_memory_range_copy(ir.as_bytes(), "xpu-lir");
    let module =
        context.create_module_from_ir(buffer).map_err(|e| CompileError::Parse(e.to_string()))?;
    module.verify().map_err(|e| CompileError::Verify(e.to_string()))?;
    module.set_triple(&tm.get_triple());
    module.set_data_layout(&tm.get_target_data().get_data_layout());
    let options = PassBuilderOptions::create();
    options.set_loop_vectorization(true);
    options.set_loop_slp_vectorization(true);
    options.set_loop_unrolling(true);
    module
        .run_passes("default<O3>", &tm, options)
        .map_err(|e| CompileError::Passes(e.to_string()))?;
    match what {
        Emit::OptimizedIr => Ok(module.print_to_string().to_bytes().to_vec()),
        Emit::Object | Emit::Asm => {
            let kind = if what == Emit::Object { FileType::Object } else { FileType::Assembly };
            let out = tm
                .write_to_memory_buffer(&module, kind)
                .map_err(|e| CompileError::Emit(e.to_string()))?;
            Ok(out.as_slice().to_vec())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn target(features: &str) -> Target {
        Target {
            triple: "x86_64-unknown-linux-gnu".into(),
            cpu: "x".into(),
            features: features.into(),
            abi: None,
        }
    }

    #[test]
    fn avx512_hosts_get_512_bit_vectors_and_others_keep_theirs() {
        let wide = wide_vectors("+sse2,+avx,+avx2,+avx512f,+avx512vl".into());
        assert!(wide.ends_with(",-prefer-256-bit"), "{wide}");
        assert_eq!(target(&wide).vector_bits(), 512);
        // Not mistaken for +avx512f: a feature that only starts the same.
        let avx2 = wide_vectors("+sse2,+avx,+avx2,-avx512f,+avx512fp16x".into());
        assert!(!avx2.contains("prefer-256-bit"), "{avx2}");
        assert_eq!(target(&avx2).vector_bits(), 256);
        assert_eq!(target("+sse2,+sse4.2").vector_bits(), 128);
        assert_eq!(Target::riscv64(RiscvCpu::Rv64gcv).vector_bits(), 128);
        let host = Target::host();
        let avx512 = host.features.split(',').any(|f| f == "+avx512f");
        assert_eq!(host.vector_bits() == 512, avx512, "{}", host.features);
    }

    /// What an AVX2 host (x86-64-v3) reports, less anything about AVX-512.
    const AVX2_HOST: &str = "+sse2,+sse3,+ssse3,+sse4.1,+sse4.2,+popcnt,+cx16,+sahf,+avx,+avx2,\
        +bmi,+bmi2,+f16c,+fma,+lzcnt,+movbe,+xsave";

    #[test]
    fn a_host_is_held_to_the_levels_it_has_and_refused_the_others() {
        let avx2_host = Target { cpu: "znver3".into(), ..target(&format!("{AVX2_HOST},-avx512f")) };
        assert_eq!(avx2_host.clone().held_to(HostCpu::Native), Ok(avx2_host.clone()));
        let v3 = avx2_host.clone().held_to(HostCpu::X86_64V3).unwrap();
        assert_eq!((v3.cpu.as_str(), v3.vector_bits()), ("x86-64-v3", 256));
        assert!(!v3.features.contains("avx512"), "{}", v3.features);
        assert_eq!(avx2_host.clone().held_to(HostCpu::X86_64V2).unwrap().vector_bits(), 128);
        let e = avx2_host.held_to(HostCpu::X86_64V4).unwrap_err();
        assert!(e.contains("x86-64-v4") && e.contains("znver3") && e.contains("avx512f"), "{e}");
        assert!(!e.contains("avx2"), "only what is missing is named: {e}");
        // AVX-512 instructions on 256-bit registers only (AVX10/256): no x86-64-v4.
        let avx10_256 = Target {
            cpu: "avx10-256".into(),
            ..target(&format!(
                "{AVX2_HOST},+avx512f,+avx512bw,+avx512cd,+avx512dq,+avx512vl,-evex512"
            ))
        };
        let e = avx10_256.clone().held_to(HostCpu::X86_64V4).unwrap_err();
        assert!(e.ends_with("lacks evex512"), "{e}");
        assert_eq!(avx10_256.held_to(HostCpu::X86_64V3).unwrap().vector_bits(), 256);
        let e = Target::riscv64(RiscvCpu::Rv64gc).held_to(HostCpu::X86_64V3).unwrap_err();
        assert!(e.contains("riscv64"), "{e}");
        // The host itself: a level it has gives that level's vector width.
        let host = Target::host();
        if let Ok(v4) = host.clone().held_to(HostCpu::X86_64V4) {
            assert_eq!(v4.vector_bits(), 512);
        }
        if let Ok(v3) = host.held_to(HostCpu::X86_64V3) {
            assert_eq!(v3.vector_bits(), 256);
        }
    }
}
