//! The native half of the Python package `xpu` (`xpu._xpu`): a thin binding of the Rust
//! runtime, not a second implementation. A [`session::Session`] loads a program, plans it
//! once under a policy on this process's engines and runs it with the GIL released; a
//! [`policy::PyPolicy`] is a policy loaded, merged and checked by the same loader as
//! `xpuctl policy check`; [`program::run_minilang`] runs a MiniLang program and returns what
//! it prints. Numpy arrays cross through [`arrays`], tables through Arrow's C stream
//! interface ([`tables`]); failures become the Python exceptions
//! of `xpu.errors` ([`errors`]), each with the name of what is wrong. The Python side
//! (`python/xpu`) maps keyword arguments onto policies and shapes the public API.

mod arrays;
mod engines;
mod errors;
mod policy;
mod program;
mod session;
mod tables;

use pyo3::prelude::*;

/// `xpu._xpu`: classes and functions the Python package wraps.
#[pymodule]
fn _xpu(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<session::Session>()?;
    m.add_class::<policy::PyPolicy>()?;
    m.add_class::<tables::ArrowTable>()?;
    m.add_function(wrap_pyfunction!(program::run_minilang, m)?)?;
    m.add_function(wrap_pyfunction!(program::sgr_json, m)?)?;
    m.add_function(wrap_pyfunction!(engines::configure, m)?)?;
    m.add_function(wrap_pyfunction!(engines::inventory, m)?)?;
    m.add_function(wrap_pyfunction!(engines::kernels, m)?)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
