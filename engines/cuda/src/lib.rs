//! The cuda engine: LIR-ML kernels (the llvm engine's lowering of a partition) rendered as
//! CUDA C++ ([`codegen`]), compiled by NVRTC to a cubin for the device or PTX ([`toolkit`],
//! [`image`], cached in memory and on disk), and run on device 0 ([`engine`], [`exec`]):
//! values in device memory with uploads and downloads the plan lists, one arena per
//! prepared shape set ([`arena`]), one non-blocking stream per executable, CUDA graph
//! capture and replay; row groups merged into one kernel ([`rows`]); matrix products on
//! cuBLASLt ([`cublaslt`]) between generated-kernel segments. Without a GPU it is
//! `Unavailable` with the reason, as data, and what
//! can be checked without one is: PTX assembled by `ptxas`, and the same kernel source run
//! on the host through a header that maps CUDA's grid to loops ([`host`]).

pub mod arena;
pub mod codegen;
pub mod cublaslt;
pub mod engine;
mod exec;
pub mod host;
pub mod image;
pub mod lru_map;
pub mod row_cache;
pub mod rows;
mod segment;
pub mod staging;
pub mod toolkit;
pub mod vector;

pub use engine::{CudaConfig, CudaEngine, DEVICE};
