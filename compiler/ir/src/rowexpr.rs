//! Row expressions: the typed per-row computations of the table ops `filter_rows`
//! (`predicate`) and `with_column` (`expr`).
//!
//! A row expression is data, never query text: column references, literals and a fixed set of
//! functions ([`RowFunc`]) and casts. Frontends build them (MiniLang lowers its row
//! expressions here), the text and JSON forms carry them, [`RowExpr::check`] types them
//! against a table's columns, and only the engine that runs table ops renders them into its
//! own query language, quoting in one place. So a program — from MiniLang, SGR-ML text or
//! JSON — can say only what this module can express: no statements, subqueries or table
//! functions can ride inside an attribute.
//!
//! Text form (inside an attribute, `row(...)`):
//! `row(and(gt(col("Age"), 30), not_null(col("Name"))))`; literals are `1`, `2.5`, `"text"`,
//! `true`, `false`, `null`, `inf`, `nan`; casts are `cast(col("x"), i64)`.

use std::fmt;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::DType;
use crate::attr::write_float;

/// How deep a row expression may nest. Deeper input is refused by the parser and the
/// verifier, so no consumer (checker, renderer, the engine's SQL parser) recurses without
/// bound on user input.
pub const MAX_DEPTH: usize = 64;

/// The longest column name accepted (bytes).
pub const MAX_COLUMN_NAME: usize = 1024;

/// One row expression.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum RowExpr {
    /// The value of a column in this row.
    Col { name: String },
    /// A constant.
    Lit { value: Literal },
    /// An operator or function applied to its arguments.
    Call { func: RowFunc, args: Vec<RowExpr> },
    /// A conversion; a value that does not convert becomes missing (null).
    Cast { arg: Box<RowExpr>, to: DType },
}

/// A constant in a row expression.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "type", content = "value", rename_all = "snake_case", deny_unknown_fields)]
pub enum Literal {
    Null,
    Bool(bool),
    Int(i64),
    /// JSON has no infinities or NaN: those are written as the strings `"inf"`, `"-inf"`,
    /// `"nan"`.
    #[serde(with = "json_float")]
    #[schemars(with = "json_float::Repr")]
    Float(f64),
    Str(String),
}

/// A float in JSON that keeps infinities and NaN (serde_json would write them as `null`).
mod json_float {
    use schemars::JsonSchema;
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    /// What the JSON holds: a number, or one of the three names.
    #[derive(Serialize, Deserialize, JsonSchema)]
    #[serde(untagged)]
    pub enum Repr {
        Number(f64),
        Name(NonFinite),
    }

    #[derive(Serialize, Deserialize, JsonSchema)]
    pub enum NonFinite {
        #[serde(rename = "inf")]
        Inf,
        #[serde(rename = "-inf")]
        NegInf,
        #[serde(rename = "nan")]
        Nan,
    }

    pub fn serialize<S: Serializer>(x: &f64, s: S) -> Result<S::Ok, S::Error> {
        match *x {
            x if x.is_finite() => Repr::Number(x),
            x if x.is_nan() => Repr::Name(NonFinite::Nan),
            x if x > 0.0 => Repr::Name(NonFinite::Inf),
            _ => Repr::Name(NonFinite::NegInf),
        }
        .serialize(s)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
        Ok(match Repr::deserialize(d)? {
            Repr::Number(x) => x,
            Repr::Name(NonFinite::Inf) => f64::INFINITY,
            Repr::Name(NonFinite::NegInf) => f64::NEG_INFINITY,
            Repr::Name(NonFinite::Nan) => f64::NAN,
        })
    }
}

macro_rules! row_funcs {
    ($($variant:ident $name:literal $min:literal..$max:literal : $doc:literal;)*) => {
        /// The operators and functions a row expression may apply: a closed list.
        #[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
        #[serde(rename_all = "snake_case")]
        pub enum RowFunc {
            $(#[doc = $doc] $variant,)*
        }

        impl RowFunc {
            /// Every function, in declaration order.
            pub const ALL: &'static [RowFunc] = &[$(RowFunc::$variant,)*];

            /// The name in the text and JSON forms.
            pub fn name(self) -> &'static str {
                match self { $(RowFunc::$variant => $name,)* }
            }

            /// The least and most arguments it takes.
            pub fn arity(self) -> (usize, usize) {
                match self { $(RowFunc::$variant => ($min, $max),)* }
            }

            /// What it computes (for `docs/sgr-ml.md`).
            pub fn doc(self) -> &'static str {
                match self { $(RowFunc::$variant => $doc,)* }
            }

            pub fn from_name(name: &str) -> Option<RowFunc> {
                match name { $($name => Some(RowFunc::$variant),)* _ => None }
            }
        }
    };
}

row_funcs! {
    Neg "neg" 1..1: "Negation of a number.";
    Not "not" 1..1: "Logical not.";
    Add "add" 2..2: "Sum of two numbers (i64 when both are i64, else f64).";
    Sub "sub" 2..2: "Difference of two numbers.";
    Mul "mul" 2..2: "Product of two numbers.";
    Div "div" 2..2: "True division (f64).";
    Mod "mod" 2..2: "Remainder with the divisor's sign, as Python's `%` (f64).";
    Pow "pow" 2..2: "Power (f64).";
    Concat "concat" 2..2: "Concatenation of two strings.";
    Eq "eq" 2..2: "Equal (null when either side is missing).";
    Ne "ne" 2..2: "Not equal.";
    Lt "lt" 2..2: "Less than.";
    Le "le" 2..2: "Less than or equal.";
    Gt "gt" 2..2: "Greater than.";
    Ge "ge" 2..2: "Greater than or equal.";
    And "and" 2..2: "Logical and.";
    Or "or" 2..2: "Logical or.";
    IsNull "is_null" 1..1: "Whether the value is missing.";
    NotNull "not_null" 1..1: "Whether the value is present.";
    FillNull "fill_null" 2..2: "The first argument, or the second where the first is missing.";
    If "if" 3..3: "The second argument where the condition holds, else the third.";
    Abs "abs" 1..1: "Absolute value.";
    Sqrt "sqrt" 1..1: "Square root (f64).";
    Exp "exp" 1..1: "e to the power (f64).";
    Log "log" 1..1: "Natural logarithm (f64).";
    Floor "floor" 1..1: "Largest integer not above (f64).";
    Ceil "ceil" 1..1: "Smallest integer not below (f64).";
    Round "round" 1..2: "Rounded to the nearest integer, or to the given number of decimals (f64).";
    Lower "lower" 1..1: "Lower-case text.";
    Upper "upper" 1..1: "Upper-case text.";
    Len "len" 1..1: "Length of text in characters (i64).";
    Contains "contains" 2..2: "Whether the text contains the second text.";
    StartsWith "starts_with" 2..2: "Whether the text starts with the second text.";
    EndsWith "ends_with" 2..2: "Whether the text ends with the second text.";
}

/// The element types a cast may produce.
pub const CAST_TARGETS: &[DType] = &[DType::F64, DType::I64, DType::String, DType::Bool];

/// Why a row expression is refused. `path` locates the offending part (`args[0].args[1]`).
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[error("{message}{}", if path.is_empty() { String::new() } else { format!(" (at {path})") })]
pub struct RowExprError {
    pub path: String,
    pub message: String,
}

/// What [`RowExpr::check`] knows of a column name.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum ColumnType {
    /// The table has this column, of this type.
    Known(DType),
    /// The column may exist; its type is unknown until the table is read.
    Unknown,
    /// The table has no such column.
    Missing,
}

/// Whether a column name is acceptable anywhere a table op names a column: not empty, at
/// most [`MAX_COLUMN_NAME`] bytes, no NUL or other control characters.
pub fn check_column_name(name: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err("a column name may not be empty".into());
    }
    if name.len() > MAX_COLUMN_NAME {
        return Err(format!(
            "a column name may have at most {MAX_COLUMN_NAME} bytes, this one has {}",
            name.len()
        ));
    }
    if let Some(c) = name.chars().find(|c| c.is_control()) {
        return Err(format!("column name {name:?} holds the control character {c:?}"));
    }
    Ok(())
}

fn numeric(d: DType) -> bool {
    d.is_numeric()
}

impl RowExpr {
    pub fn col(name: impl Into<String>) -> RowExpr {
        RowExpr::Col { name: name.into() }
    }

    pub fn lit(value: Literal) -> RowExpr {
        RowExpr::Lit { value }
    }

    pub fn call(func: RowFunc, args: Vec<RowExpr>) -> RowExpr {
        RowExpr::Call { func, args }
    }

    pub fn cast(arg: RowExpr, to: DType) -> RowExpr {
        RowExpr::Cast { arg: Box::new(arg), to }
    }

    /// Nesting depth (a column or literal is 1). Iterative, so it is safe on any input.
    pub fn depth(&self) -> usize {
        let mut max = 0;
        let mut stack = vec![(self, 1usize)];
        while let Some((e, d)) = stack.pop() {
            max = max.max(d);
            match e {
                RowExpr::Col { .. } | RowExpr::Lit { .. } => {}
                RowExpr::Call { args, .. } => stack.extend(args.iter().map(|a| (a, d + 1))),
                RowExpr::Cast { arg, .. } => stack.push((arg, d + 1)),
            }
        }
        max
    }

    /// Every column the expression reads, in order of first mention.
    pub fn columns(&self) -> Vec<&str> {
        let mut out: Vec<&str> = Vec::new();
        let mut stack = vec![self];
        while let Some(e) = stack.pop() {
            match e {
                RowExpr::Col { name } => {
                    if !out.contains(&name.as_str()) {
                        out.push(name);
                    }
                }
                RowExpr::Lit { .. } => {}
                RowExpr::Call { args, .. } => stack.extend(args.iter().rev()),
                RowExpr::Cast { arg, .. } => stack.push(arg),
            }
        }
        out
    }

    /// Checks the expression against a table's columns and returns its type (`None`: not
    /// known before the data is read, e.g. a column of unknown type). Refuses unknown
    /// columns, bad column names, wrong argument counts and types, casts to types a table
    /// cannot hold, and nesting deeper than [`MAX_DEPTH`].
    pub fn check(
        &self,
        columns: &dyn Fn(&str) -> ColumnType,
    ) -> Result<Option<DType>, RowExprError> {
        if self.depth() > MAX_DEPTH {
            return Err(RowExprError {
                path: String::new(),
                message: format!("a row expression may nest at most {MAX_DEPTH} levels deep"),
            });
        }
        self.check_at(columns, &mut String::new())
    }

    fn check_at(
        &self,
        columns: &dyn Fn(&str) -> ColumnType,
        path: &mut String,
    ) -> Result<Option<DType>, RowExprError> {
        let fail = |path: &str, message: String| RowExprError { path: path.to_string(), message };
        match self {
            RowExpr::Col { name } => {
                check_column_name(name).map_err(|m| fail(path, m))?;
                match columns(name) {
                    ColumnType::Known(d) => Ok(Some(d)),
                    ColumnType::Unknown => Ok(None),
                    ColumnType::Missing => Err(fail(path, format!("unknown column {name:?}"))),
                }
            }
            RowExpr::Lit { value } => Ok(value.dtype()),
            RowExpr::Cast { arg, to } => {
                let len = path.len();
                path.push_str(if path.is_empty() { "arg" } else { ".arg" });
                arg.check_at(columns, path)?;
                path.truncate(len);
                if !CAST_TARGETS.contains(to) {
                    return Err(fail(
                        path,
                        format!("cannot cast to {to}: a column is f64, i64, string or bool"),
                    ));
                }
                Ok(Some(*to))
            }
            RowExpr::Call { func, args } => {
                let (min, max) = func.arity();
                if args.len() < min || args.len() > max {
                    let want = if min == max { min.to_string() } else { format!("{min} or {max}") };
                    return Err(fail(
                        path,
                        format!("`{}` takes {want} argument(s), not {}", func.name(), args.len()),
                    ));
                }
                let mut types = Vec::with_capacity(args.len());
                for (i, a) in args.iter().enumerate() {
                    let len = path.len();
                    if !path.is_empty() {
                        path.push('.');
                    }
                    path.push_str(&format!("args[{i}]"));
                    types.push(a.check_at(columns, path)?);
                    path.truncate(len);
                }
                call_type(*func, &types).map_err(|m| fail(path, m))
            }
        }
    }
}

impl Literal {
    /// The literal's type; `None` for null, which fits any type.
    pub fn dtype(&self) -> Option<DType> {
        match self {
            Literal::Null => None,
            Literal::Bool(_) => Some(DType::Bool),
            Literal::Int(_) => Some(DType::I64),
            Literal::Float(_) => Some(DType::F64),
            Literal::Str(_) => Some(DType::String),
        }
    }
}

/// The result type of `func` over arguments of these types (`None`: unknown or null), or
/// why they do not fit it.
pub fn call_type(func: RowFunc, types: &[Option<DType>]) -> Result<Option<DType>, String> {
    use RowFunc::*;
    let name = func.name();
    let shown = |t: Option<DType>| t.map(|d| d.name()).unwrap_or("unknown");
    let need = |i: usize, what: &str, ok: &dyn Fn(DType) -> bool| -> Result<(), String> {
        match types[i] {
            Some(d) if !ok(d) => Err(format!("`{name}` needs {what}, argument {i} is {d}")),
            _ => Ok(()),
        }
    };
    let all = |what: &str, ok: &dyn Fn(DType) -> bool| -> Result<(), String> {
        (0..types.len()).try_for_each(|i| need(i, what, ok))
    };
    let is_bool = |d: DType| d == DType::Bool;
    let is_text = |d: DType| d == DType::String;
    Ok(match func {
        Neg | Abs => {
            all("a number", &numeric)?;
            types[0]
        }
        Not => {
            all("a bool", &is_bool)?;
            Some(DType::Bool)
        }
        Add | Sub | Mul => {
            all("numbers", &numeric)?;
            match (types[0], types[1]) {
                (Some(a), Some(b)) if a.is_int() && b.is_int() => Some(DType::I64),
                (Some(_), Some(_)) => Some(DType::F64),
                _ => None,
            }
        }
        Div | Mod | Pow => {
            all("numbers", &numeric)?;
            Some(DType::F64)
        }
        Concat => {
            all("strings", &is_text)?;
            Some(DType::String)
        }
        Eq | Ne | Lt | Le | Gt | Ge => {
            if let (Some(a), Some(b)) = (types[0], types[1])
                && a != b
                && !(numeric(a) && numeric(b))
            {
                return Err(format!(
                    "`{name}` compares values of different kinds: {} and {}",
                    shown(types[0]),
                    shown(types[1])
                ));
            }
            Some(DType::Bool)
        }
        And | Or => {
            all("bools", &is_bool)?;
            Some(DType::Bool)
        }
        IsNull | NotNull => Some(DType::Bool),
        FillNull => unify(name, types[0], types[1])?,
        If => {
            need(0, "a bool condition", &is_bool)?;
            unify(name, types[1], types[2])?
        }
        Sqrt | Exp | Log | Floor | Ceil => {
            all("a number", &numeric)?;
            Some(DType::F64)
        }
        Round => {
            need(0, "a number", &numeric)?;
            if types.len() == 2 {
                need(1, "an integer number of decimals", &|d: DType| d.is_int())?;
            }
            Some(DType::F64)
        }
        Lower | Upper => {
            all("a string", &is_text)?;
            Some(DType::String)
        }
        Len => {
            all("a string", &is_text)?;
            Some(DType::I64)
        }
        Contains | StartsWith | EndsWith => {
            all("strings", &is_text)?;
            Some(DType::Bool)
        }
    })
}

/// The type of a value that is one of two (`if`, `fill_null`): equal types, or numbers.
fn unify(name: &str, a: Option<DType>, b: Option<DType>) -> Result<Option<DType>, String> {
    match (a, b) {
        (Some(x), Some(y)) if x == y => Ok(Some(x)),
        (Some(x), Some(y)) if numeric(x) && numeric(y) => Ok(Some(DType::F64)),
        (Some(x), Some(y)) => Err(format!("`{name}` mixes {x} and {y}")),
        (x, None) | (None, x) => Ok(x),
    }
}

impl fmt::Display for RowExpr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RowExpr::Col { name } => write!(f, "col({name:?})"),
            RowExpr::Lit { value } => write!(f, "{value}"),
            RowExpr::Cast { arg, to } => write!(f, "cast({arg}, {to})"),
            RowExpr::Call { func, args } => {
                write!(f, "{}(", func.name())?;
                for (i, a) in args.iter().enumerate() {
                    if i > 0 {
                        f.write_str(", ")?;
                    }
                    write!(f, "{a}")?;
                }
                f.write_str(")")
            }
        }
    }
}

impl fmt::Display for Literal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Literal::Null => f.write_str("null"),
            Literal::Bool(b) => write!(f, "{b}"),
            Literal::Int(i) => write!(f, "{i}"),
            // A float always prints with a point or exponent (or as inf/nan), so it parses
            // back as a float, not an int.
            Literal::Float(x) => write_float(f, *x),
            Literal::Str(s) => write!(f, "{s:?}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cols(name: &str) -> ColumnType {
        match name {
            "Age" => ColumnType::Known(DType::F64),
            "N" => ColumnType::Known(DType::I64),
            "Name" => ColumnType::Known(DType::String),
            "Alive" => ColumnType::Known(DType::Bool),
            "Pivoted" => ColumnType::Unknown,
            _ => ColumnType::Missing,
        }
    }

    fn check(e: RowExpr, expect: Result<Option<DType>, &str>) {
        let got = e.check(&cols).map_err(|e| e.to_string());
        assert_eq!(got, expect.map_err(str::to_string), "{e}");
    }

    #[test]
    fn types_follow_the_functions() {
        use RowFunc::*;
        let c = RowExpr::col;
        let int = |i| RowExpr::lit(Literal::Int(i));
        check(RowExpr::call(Gt, vec![c("Age"), int(30)]), Ok(Some(DType::Bool)));
        check(RowExpr::call(Add, vec![c("N"), int(1)]), Ok(Some(DType::I64)));
        check(RowExpr::call(Add, vec![c("Age"), int(1)]), Ok(Some(DType::F64)));
        check(RowExpr::call(Add, vec![c("Pivoted"), int(1)]), Ok(None));
        check(RowExpr::call(Len, vec![c("Name")]), Ok(Some(DType::I64)));
        check(RowExpr::cast(c("Name"), DType::I64), Ok(Some(DType::I64)));
        check(RowExpr::call(If, vec![c("Alive"), c("N"), c("Age")]), Ok(Some(DType::F64)));
        check(
            RowExpr::call(Gt, vec![c("Agee"), int(30)]),
            Err("unknown column \"Agee\" (at args[0])"),
        );
        check(
            RowExpr::call(Gt, vec![c("Name"), int(30)]),
            Err("`gt` compares values of different kinds: string and i64"),
        );
        check(RowExpr::call(Lower, vec![c("N")]), Err("`lower` needs a string, argument 0 is i64"));
        check(RowExpr::call(Not, vec![]), Err("`not` takes 1 argument(s), not 0"));
        check(
            RowExpr::cast(c("N"), DType::F16),
            Err("cannot cast to f16: a column is f64, i64, string or bool"),
        );
        check(RowExpr::col("a\0b"), Err("column name \"a\\0b\" holds the control character '\\0'"));
    }

    #[test]
    fn nesting_is_bounded_without_recursion_in_depth() {
        let mut e = RowExpr::col("N");
        for _ in 0..100_000 {
            e = RowExpr::call(RowFunc::Neg, vec![e]);
        }
        assert_eq!(e.depth(), 100_001);
        let err = e.check(&cols).unwrap_err();
        assert!(err.message.contains("at most 64 levels"), "{err}");
        // Dropping a deep tree must not overflow the stack either.
        drop_deep(e);
    }

    /// Takes a deep expression apart iteratively (the derived Drop would recurse).
    fn drop_deep(e: RowExpr) {
        let mut stack = vec![e];
        while let Some(e) = stack.pop() {
            match e {
                RowExpr::Call { args, .. } => stack.extend(args),
                RowExpr::Cast { arg, .. } => stack.push(*arg),
                _ => {}
            }
        }
    }

    #[test]
    fn the_text_and_json_forms_round_trip() {
        use crate::{Attr, Attrs, Graph, Op};
        let mut g = Graph::new("rows");
        let read = Attrs::new().with("path", Attr::Str("people.csv".into()));
        let mut v = g.add_op(Op::ReadCsv, &[], read).unwrap();
        let lits = [
            Literal::Null,
            Literal::Bool(true),
            Literal::Int(-5),
            Literal::Int(i64::MIN),
            Literal::Float(-0.5),
            Literal::Float(1e-300),
            Literal::Float(f64::NEG_INFINITY),
            Literal::Str("x\"'); --\n\u{1F600}".into()),
        ];
        // One node per function over columns (of unknown type in the IR, so any function
        // takes them), one per literal, one cast.
        let mut exprs: Vec<RowExpr> = RowFunc::ALL
            .iter()
            .enumerate()
            .map(|(i, f)| {
                let cols = ["Age", "N \"quoted\""];
                let args = (0..f.arity().1).map(|k| RowExpr::col(cols[(i + k) % 2])).collect();
                RowExpr::call(*f, args)
            })
            .collect();
        exprs.extend(
            lits.iter().map(|l| RowExpr::call(RowFunc::IsNull, vec![RowExpr::lit(l.clone())])),
        );
        exprs.push(RowExpr::cast(RowExpr::col("Age"), DType::I64));
        for (i, e) in exprs.into_iter().enumerate() {
            let attrs =
                Attrs::new().with("expr", Attr::Row(e)).with("name", Attr::Str(format!("c{i}")));
            v = g.add_op(Op::WithColumn, &[v], attrs).unwrap();
        }
        g.add_output("out", v);
        let text = crate::text::print(&g);
        let back = crate::text::parse(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
        assert_eq!(crate::text::print(&back), text);
        assert_eq!(back, g);
        let json = crate::to_json(&g);
        assert_eq!(crate::from_json(&json).unwrap(), g);
    }

    #[test]
    fn every_function_has_a_unique_name() {
        for f in RowFunc::ALL {
            assert_eq!(RowFunc::from_name(f.name()), Some(*f));
        }
    }
}
