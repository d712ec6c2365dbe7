//! Compiled programs, kept by content: the same program text with the same input types
//! compiles to the same graph, so a warm submit skips parsing, lowering and hashing the
//! graph. Only programs that name no file are kept — a program reading a table depends on
//! the file's schema, which may change between jobs.

use std::collections::BTreeMap;
use std::num::NonZeroUsize;
use std::sync::{Arc, Mutex};

use xpu_ir::{DType, Graph, TensorType};
use xpu_minilang::paths::DataRoots;
use xpu_runtime::ProgramError;

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct Key {
    /// The name gives the language and the graph's name.
    name: String,
    sha256: String,
    input_types: BTreeMap<String, TensorType>,
    /// A table input's columns type the program as a file's header does.
    table_columns: BTreeMap<String, Vec<(String, DType)>>,
}

impl Key {
    fn of(name: &str, sha256: &str, inputs: &xpu_minilang::lower::Inputs) -> Key {
        Key {
            name: name.into(),
            sha256: sha256.into(),
            input_types: inputs.types.clone(),
            table_columns: inputs.table_columns.clone(),
        }
    }
}

/// A graph and its content hash (the plan cache's key).
#[derive(Clone, Debug)]
pub struct CompiledGraph {
    pub graph: Arc<Graph>,
    pub hash: Arc<str>,
}

pub struct CompileCache {
    entries: Mutex<lru::LruCache<Key, CompiledGraph>>,
}

impl CompileCache {
    pub fn new(capacity: usize) -> CompileCache {
        let capacity = NonZeroUsize::new(capacity).unwrap_or(NonZeroUsize::MIN);
        CompileCache { entries: Mutex::new(lru::LruCache::new(capacity)) }
    }

    /// The graph of a program compiled earlier, if it is still kept.
    pub fn get(
        &self,
        name: &str,
        sha256: &str,
        inputs: &xpu_minilang::lower::Inputs,
    ) -> Option<CompiledGraph> {
        self.lock().get(&Key::of(name, sha256, inputs)).cloned()
    }

    /// The graph of `bytes` (`sha256` is theirs), compiled now or found; the flag says
    /// whether it was found.
    pub fn get_or_compile(
        &self,
        name: &str,
        bytes: &[u8],
        sha256: &str,
        roots: &DataRoots,
        inputs: &xpu_minilang::lower::Inputs,
    ) -> Result<(CompiledGraph, bool), ProgramError> {
        let key = Key::of(name, sha256, inputs);
        if let Some(hit) = self.lock().get(&key) {
            return Ok((hit.clone(), true));
        }
        let compiled = xpu_runtime::program::compile(name, bytes, roots, inputs)?;
        let graph = Arc::new(compiled.graph);
        let found = CompiledGraph { hash: graph.content_hash().into(), graph };
        if compiled.files.is_empty() {
            self.lock().put(key, found.clone());
        }
        Ok((found, false))
    }

    pub fn len(&self) -> usize {
        self.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, lru::LruCache<Key, CompiledGraph>> {
        // A map of finished entries: still consistent after a panic elsewhere.
        self.entries.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pure_programs_are_kept_and_file_readers_are_not() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("t.csv"), "a,b\n1,2\n").unwrap();
        let roots = DataRoots::new([dir.path().to_path_buf()]);
        let cache = CompileCache::new(8);
        let inputs = xpu_minilang::lower::Inputs::default();
        let pure = b"let x = [[1.0, 2.0], [3.0, 4.0]]\nprint x + x\n";
        let compile = |name: &str, bytes: &[u8]| {
            let sha = crate::jobs::sha256_hex(bytes);
            cache.get_or_compile(name, bytes, &sha, &roots, &inputs).unwrap()
        };
        let (a, hit) = compile("p.ml", pure);
        assert!(!hit);
        let (b, hit) = compile("p.ml", pure);
        assert!(hit && Arc::ptr_eq(&a.graph, &b.graph));
        let sha = crate::jobs::sha256_hex(pure);
        assert!(cache.get("p.ml", &sha, &inputs).is_some_and(|c| Arc::ptr_eq(&c.graph, &a.graph)));
        assert!(cache.get("p.ml", "0", &inputs).is_none());
        assert_eq!(&*a.hash, a.graph.content_hash());
        let (_, hit) = compile("q.ml", pure);
        assert!(!hit, "another name is another graph name");
        let reads = b"let t = load_csv(\"t.csv\")\nprint t\n";
        let (_, hit) = compile("r.ml", reads);
        let (_, again) = compile("r.ml", reads);
        assert!(!hit && !again, "a program reading a file compiles every time");
        assert_eq!(cache.len(), 2);
    }
}
