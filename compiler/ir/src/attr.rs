//! Node attributes: typed, named constants that parameterise an op.

use std::collections::BTreeMap;
use std::fmt;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::{DType, Graph, RowExpr, Tensor};

/// One attribute value.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "kind", content = "value", rename_all = "snake_case")]
pub enum Attr {
    Int(i64),
    Float(f64),
    Str(String),
    Ints(Vec<i64>),
    Floats(Vec<f64>),
    Strs(Vec<String>),
    Tensor(Tensor),
    #[serde(rename = "dtype")]
    DType(DType),
    /// A typed row expression of a table op (`filter_rows.predicate`, `with_column.expr`).
    Row(RowExpr),
    /// A subgraph of a control-flow op (`if.then_branch`, `loop.body`): a closed graph whose
    /// inputs are the values the op hands it.
    Graph(Box<Graph>),
}

/// The kinds an attribute schema can require.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum AttrKind {
    Int,
    Float,
    Str,
    Ints,
    Floats,
    Strs,
    Tensor,
    DType,
    Row,
    Graph,
}

impl AttrKind {
    pub fn name(self) -> &'static str {
        match self {
            AttrKind::Int => "int",
            AttrKind::Float => "float",
            AttrKind::Str => "string",
            AttrKind::Ints => "ints",
            AttrKind::Floats => "floats",
            AttrKind::Strs => "strings",
            AttrKind::Tensor => "tensor",
            AttrKind::DType => "dtype",
            AttrKind::Row => "a row expression",
            AttrKind::Graph => "a graph",
        }
    }
}

impl Attr {
    pub fn kind(&self) -> AttrKind {
        match self {
            Attr::Int(_) => AttrKind::Int,
            Attr::Float(_) => AttrKind::Float,
            Attr::Str(_) => AttrKind::Str,
            Attr::Ints(_) => AttrKind::Ints,
            Attr::Floats(_) => AttrKind::Floats,
            Attr::Strs(_) => AttrKind::Strs,
            Attr::Tensor(_) => AttrKind::Tensor,
            Attr::DType(_) => AttrKind::DType,
            Attr::Row(_) => AttrKind::Row,
            Attr::Graph(_) => AttrKind::Graph,
        }
    }

    /// Whether a value of this attribute satisfies a schema kind (an int literal may stand
    /// for a float, and an empty list for any list kind).
    pub fn fits(&self, kind: AttrKind) -> bool {
        match (self, kind) {
            (a, k) if a.kind() == k => true,
            (Attr::Int(_), AttrKind::Float) => true,
            (Attr::Ints(v), AttrKind::Floats | AttrKind::Strs) => v.is_empty(),
            (Attr::Floats(v), AttrKind::Ints | AttrKind::Strs) => v.is_empty(),
            _ => false,
        }
    }
}

/// Attributes of one node, ordered by name so the text form and hashes are stable.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(transparent)]
pub struct Attrs(pub BTreeMap<String, Attr>);

impl Attrs {
    pub fn new() -> Attrs {
        Attrs::default()
    }

    pub fn with(mut self, name: &str, value: Attr) -> Attrs {
        self.0.insert(name.to_string(), value);
        self
    }

    pub fn set(&mut self, name: &str, value: Attr) {
        self.0.insert(name.to_string(), value);
    }

    pub fn get(&self, name: &str) -> Option<&Attr> {
        self.0.get(name)
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn iter(&self) -> impl Iterator<Item = (&String, &Attr)> {
        self.0.iter()
    }

    pub fn int(&self, name: &str, default: i64) -> i64 {
        match self.0.get(name) {
            Some(Attr::Int(v)) => *v,
            _ => default,
        }
    }

    pub fn opt_int(&self, name: &str) -> Option<i64> {
        match self.0.get(name) {
            Some(Attr::Int(v)) => Some(*v),
            _ => None,
        }
    }

    pub fn float(&self, name: &str, default: f64) -> f64 {
        match self.0.get(name) {
            Some(Attr::Float(v)) => *v,
            Some(Attr::Int(v)) => *v as f64,
            _ => default,
        }
    }

    pub fn opt_float(&self, name: &str) -> Option<f64> {
        match self.0.get(name) {
            Some(Attr::Float(v)) => Some(*v),
            Some(Attr::Int(v)) => Some(*v as f64),
            _ => None,
        }
    }

    pub fn str<'a>(&'a self, name: &str, default: &'a str) -> &'a str {
        match self.0.get(name) {
            Some(Attr::Str(v)) => v,
            _ => default,
        }
    }

    pub fn ints(&self, name: &str) -> Option<&[i64]> {
        match self.0.get(name) {
            Some(Attr::Ints(v)) => Some(v),
            Some(Attr::Floats(v)) if v.is_empty() => Some(&[]),
            _ => None,
        }
    }

    pub fn floats(&self, name: &str) -> Option<&[f64]> {
        match self.0.get(name) {
            Some(Attr::Floats(v)) => Some(v),
            Some(Attr::Ints(v)) if v.is_empty() => Some(&[]),
            _ => None,
        }
    }

    pub fn strs(&self, name: &str) -> Option<&[String]> {
        match self.0.get(name) {
            Some(Attr::Strs(v)) => Some(v),
            _ => None,
        }
    }

    pub fn tensor(&self, name: &str) -> Option<&Tensor> {
        match self.0.get(name) {
            Some(Attr::Tensor(t)) => Some(t),
            _ => None,
        }
    }

    pub fn row(&self, name: &str) -> Option<&RowExpr> {
        match self.0.get(name) {
            Some(Attr::Row(e)) => Some(e),
            _ => None,
        }
    }

    pub fn graph(&self, name: &str) -> Option<&Graph> {
        match self.0.get(name) {
            Some(Attr::Graph(g)) => Some(g),
            _ => None,
        }
    }

    /// Every subgraph attribute, by name (the control-flow ops').
    pub fn graphs(&self) -> impl Iterator<Item = (&str, &Graph)> {
        self.0.iter().filter_map(|(k, a)| match a {
            Attr::Graph(g) => Some((k.as_str(), &**g)),
            _ => None,
        })
    }

    pub fn dtype(&self, name: &str) -> Option<DType> {
        match self.0.get(name) {
            Some(Attr::DType(d)) => Some(*d),
            _ => None,
        }
    }
}

/// Writes a float so that parsing it back yields the same bits (`1.0`, `1e-7`, `inf`, `nan`).
pub(crate) fn write_float(f: &mut dyn fmt::Write, x: f64) -> fmt::Result {
    if x.is_nan() {
        f.write_str("nan")
    } else if x.is_infinite() {
        f.write_str(if x > 0.0 { "inf" } else { "-inf" })
    } else {
        write!(f, "{x:?}")
    }
}
