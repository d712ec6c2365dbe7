//! The cuda engine's foundations, usable and tested without a GPU: LIR-ML kernels rendered
//! as CUDA C++ ([`codegen`]), compiled by NVRTC to PTX for an architecture and assembled by
//! `ptxas` to check it ([`toolkit`]), the same source run on the host through a header that
//! maps CUDA's grid to loops ([`host`]), and the CUDA libraries found by configuration and
//! loaded at run time, a missing library or device being a reason, never a panic
//! ([`toolkit::probe_driver`]). The executing engine (device buffers, cuBLASLt, streams,
//! graphs) builds on these.

pub mod codegen;
pub mod host;
pub mod toolkit;
