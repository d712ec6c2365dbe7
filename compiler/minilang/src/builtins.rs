//! The table of every function MiniLang provides: name, where it may be called, its
//! parameters with types and defaults, what it returns, one line of meaning and one
//! example. It is the single source the checker asks ("is this a builtin?"), the lowering
//! dispatches from (table vs tensor calls), and `xpuctl ask` renders into the language
//! reference it gives a model — so a builtin added here appears everywhere with no other
//! edit, and a builtin missing here is an unknown name (E0100) to the checker.
//!
//! Every example is a whole program over `people.csv` (columns `name`, `city` strings,
//! `age` integers, `fare` floats); a test parses, checks and lowers each one.

/// Where a function may be called.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum Family {
    /// Tensors, lists and compile-time values, anywhere.
    Tensor,
    /// Tables (the `table` engine), anywhere.
    Table,
    /// A table first, then row expressions that name columns bare.
    ColumnScoped,
    /// Only inside `agg(...)`: a group's aggregate of a column.
    Aggregate,
    /// Only inside `filter`/`with_column` row expressions: per-row values.
    Row,
}

impl Family {
    pub fn title(self) -> &'static str {
        match self {
            Family::Tensor => "tensor and compile-time functions",
            Family::Table => "table functions",
            Family::ColumnScoped => "table functions whose later arguments name columns bare",
            Family::Aggregate => "aggregates (only inside agg)",
            Family::Row => "row functions (only inside filter / with_column)",
        }
    }
}

/// One parameter: its name (usable as `name = value`), its type as the reference writes
/// it, its default when it may be left out, and whether it is taken only by name.
#[derive(Copy, Clone, Debug)]
pub struct Param {
    pub name: &'static str,
    pub ty: &'static str,
    pub default: Option<&'static str>,
    pub named_only: bool,
}

/// One builtin function.
#[derive(Copy, Clone, Debug)]
pub struct Builtin {
    pub name: &'static str,
    pub family: Family,
    pub params: &'static [Param],
    /// Whether arguments beyond `params` are taken (`name = expr` pairs of `with_column`
    /// and `agg`, the columns of `group_by`).
    pub variadic: bool,
    pub returns: &'static str,
    pub summary: &'static str,
    pub example: &'static str,
}

impl Builtin {
    /// `name(p: type, q: type = default, *, r: type = default, …) -> returns`: the
    /// parameters after `*` are taken by name only (as in Python).
    pub fn signature(&self) -> String {
        let mut params: Vec<String> = Vec::new();
        for (i, p) in self.params.iter().enumerate() {
            if p.named_only && (i == 0 || !self.params[i - 1].named_only) {
                params.push("*".into());
            }
            params.push(match p.default {
                Some(d) => format!("{}: {} = {d}", p.name, p.ty),
                None => format!("{}: {}", p.name, p.ty),
            });
        }
        if self.variadic {
            params.push("…".into());
        }
        format!("{}({}) -> {}", self.name, params.join(", "), self.returns)
    }
}

const fn req(name: &'static str, ty: &'static str) -> Param {
    Param { name, ty, default: None, named_only: false }
}

const fn opt(name: &'static str, ty: &'static str, default: &'static str) -> Param {
    Param { name, ty, default: Some(default), named_only: false }
}

/// A parameter taken only as `name = value`.
const fn kw(name: &'static str, ty: &'static str, default: Option<&'static str>) -> Param {
    Param { name, ty, default, named_only: true }
}

const fn tensor_fn(
    name: &'static str,
    params: &'static [Param],
    returns: &'static str,
    summary: &'static str,
    example: &'static str,
) -> Builtin {
    Builtin { name, family: Family::Tensor, params, variadic: false, returns, summary, example }
}

const fn table_fn(
    name: &'static str,
    params: &'static [Param],
    returns: &'static str,
    summary: &'static str,
    example: &'static str,
) -> Builtin {
    Builtin { name, family: Family::Table, params, variadic: false, returns, summary, example }
}

const fn aggregate(name: &'static str, summary: &'static str, example: &'static str) -> Builtin {
    Builtin {
        name,
        family: Family::Aggregate,
        params: COLUMN,
        variadic: false,
        returns: "value",
        summary,
        example,
    }
}

const fn row_fn(
    name: &'static str,
    params: &'static [Param],
    returns: &'static str,
    summary: &'static str,
    example: &'static str,
) -> Builtin {
    Builtin { name, family: Family::Row, params, variadic: false, returns, summary, example }
}

const X: &[Param] = &[req("x", "tensor")];
const COLUMN: &[Param] = &[req("column", "column")];
const REDUCE: &[Param] = &[
    req("x", "tensor"),
    opt("axis", "int | list[int]", "null"),
    kw("keepdims", "bool", Some("false")),
];
const SHAPE: &[Param] = &[req("shape", "list[int]")];
const TABLE: &[Param] = &[req("table", "table")];
const ROW_X: &[Param] = &[req("x", "row value")];

/// Every builtin, grouped by family; a name may appear in several families (`sum` is a
/// tensor reduction and an aggregate; `abs` a tensor and a row function).
pub const BUILTINS: &[Builtin] = &[
    // Tensors and compile-time values.
    tensor_fn(
        "input",
        &[
            req("name", "string"),
            opt("dtype", "string", "from the file"),
            opt("shape", "list[int | string]", "from the file"),
        ],
        "tensor | table",
        "a graph input given as --input NAME=FILE (.npy, or .csv with dtype=\"table\")",
        "let x = input(\"x\", dtype=\"f64\", shape=[\"N\", 4])\nprint sum(x, axis=1)",
    ),
    tensor_fn(
        "model",
        &[req("path", "string")],
        "model",
        "an ONNX or SGR-ML model inside the data roots; call it on tensors: m(x)",
        "let m = model(\"net.sgr\")\nprint m(input(\"x\", dtype=\"f64\", shape=[\"N\", 2]))",
    ),
    tensor_fn("zeros", SHAPE, "tensor[f64]", "a tensor of zeros", "print zeros([2, 3])"),
    tensor_fn("ones", SHAPE, "tensor[f64]", "a tensor of ones", "print ones([2, 3])"),
    tensor_fn(
        "full",
        &[req("shape", "list[int]"), req("value", "number")],
        "tensor",
        "a tensor filled with one value",
        "print full([2, 2], 7.5)",
    ),
    tensor_fn(
        "arange",
        &[
            req("start", "int"),
            opt("stop", "int", "start, counting from 0"),
            opt("step", "int", "1"),
        ],
        "tensor[i64]",
        "start, start+step, … below stop (arange(n) is 0..n)",
        "print arange(0, 10, 2)",
    ),
    tensor_fn(
        "randn",
        &[req("shape", "list[int]"), opt("seed", "int", "0")],
        "tensor[f64]",
        "standard normal samples, the same on every machine for a seed",
        "print randn([2, 2], seed=7)",
    ),
    tensor_fn("relu", X, "tensor", "max(x, 0) elementwise", "print relu([-1.0, 2.0])"),
    tensor_fn("gelu", X, "tensor", "GELU elementwise", "print gelu([0.5, 1.0])"),
    tensor_fn("tanh", X, "tensor", "tanh elementwise", "print tanh([0.5, 1.0])"),
    tensor_fn("sigmoid", X, "tensor", "1 / (1 + exp(-x)) elementwise", "print sigmoid([0.0, 2.0])"),
    tensor_fn("exp", X, "tensor", "e^x elementwise", "print exp([0.0, 1.0])"),
    tensor_fn("log", X, "tensor", "natural logarithm elementwise", "print log([1.0, 10.0])"),
    tensor_fn("sqrt", X, "tensor", "square root elementwise", "print sqrt([4.0, 9.0])"),
    tensor_fn("abs", X, "tensor", "absolute value elementwise", "print abs([-3.0, 2.0])"),
    tensor_fn(
        "softmax",
        &[req("x", "tensor"), opt("axis", "int", "-1")],
        "tensor",
        "softmax along an axis",
        "print softmax([[1.0, 2.0, 3.0]], axis=-1)",
    ),
    tensor_fn(
        "sum",
        REDUCE,
        "tensor",
        "sum over axes (all by default)",
        "print sum([[1, 2], [3, 4]], axis=0)",
    ),
    tensor_fn(
        "mean",
        REDUCE,
        "tensor",
        "mean over axes (all by default)",
        "print mean([[1.0, 2.0], [3.0, 4.0]], axis=1)",
    ),
    tensor_fn(
        "max",
        REDUCE,
        "tensor",
        "maximum over axes (all by default)",
        "print max([[1, 5], [3, 4]])",
    ),
    tensor_fn(
        "min",
        REDUCE,
        "tensor",
        "minimum over axes (all by default)",
        "print min([[1, 5], [3, 4]], axis=1, keepdims=true)",
    ),
    tensor_fn(
        "reshape",
        &[req("x", "tensor"), req("shape", "list[int]")],
        "tensor",
        "the same elements in a new shape (-1 infers one dim)",
        "print reshape(arange(6), [2, 3])",
    ),
    tensor_fn(
        "transpose",
        &[req("x", "tensor"), opt("perm", "list[int]", "reversed dims")],
        "tensor",
        "dims permuted",
        "print transpose([[1, 2], [3, 4]])",
    ),
    tensor_fn(
        "concat",
        &[req("tensors", "list[tensor] | list[table]"), opt("axis", "int", "0")],
        "tensor | table",
        "tensors joined along an axis; tables stacked by column name",
        "print concat([[1, 2], [3]], axis=0)",
    ),
    tensor_fn(
        "where",
        &[req("cond", "tensor[bool]"), req("a", "tensor"), req("b", "tensor | number")],
        "tensor",
        "a where cond is true, else b",
        "let x = [1.0, -2.0, 3.0]\nprint where(x > 0.0, x, 0.0)",
    ),
    tensor_fn(
        "cast",
        &[req("x", "tensor"), req("dtype", "string")],
        "tensor",
        "elements converted to a dtype (\"f32\", \"f64\", \"i64\", \"bool\", …)",
        "print cast([1, 2], \"f64\")",
    ),
    tensor_fn(
        "shape",
        X,
        "list[int]",
        "the dims of a tensor, a compile-time list",
        "print shape(zeros([2, 3]))",
    ),
    tensor_fn(
        "len",
        &[req("x", "list | tensor")],
        "int",
        "length of a list, or the first dim of a tensor",
        "print len([1, 2, 3])",
    ),
    tensor_fn(
        "write_npy",
        &[req("tensor", "tensor"), req("path", "string")],
        "null",
        "writes a .npy file after the run (inside the data roots)",
        "write_npy(arange(4), \"out.npy\")",
    ),
    // Tables.
    table_fn(
        "load_csv",
        &[
            req("path", "string"),
            opt("sep", "string", "\",\""),
            kw("header", "bool", Some("true")),
            kw("na_values", "list[string]", Some("pandas' markers")),
        ],
        "table",
        "a CSV file inside the data roots; column types sniffed",
        "let t = load_csv(\"people.csv\")\nprint head(t, 3)",
    ),
    table_fn(
        "load_xlsx",
        &[req("path", "string"), opt("sheet", "string", "the first sheet")],
        "table",
        "one sheet of an .xlsx file (sheet=\"*\" stacks all sheets)",
        "let t = load_xlsx(\"people.xlsx\", sheet=\"*\")\nprint t",
    ),
    table_fn(
        "load_parquet",
        &[req("path", "string")],
        "table",
        "a Parquet file",
        "let t = load_parquet(\"people.parquet\")\nprint t",
    ),
    table_fn(
        "write_csv",
        &[req("table", "table"), req("path", "string")],
        "null",
        "writes the table as CSV after the run",
        "load_csv(\"people.csv\") |> write_csv(\"copy.csv\")",
    ),
    table_fn(
        "write_parquet",
        &[req("table", "table"), req("path", "string")],
        "null",
        "writes the table as Parquet after the run",
        "load_csv(\"people.csv\") |> write_parquet(\"copy.parquet\")",
    ),
    table_fn(
        "select",
        &[req("table", "table"), req("columns", "list[string]")],
        "table",
        "those columns, in that order (also t[[\"a\", \"b\"]])",
        "print load_csv(\"people.csv\") |> select([\"name\", \"age\"])",
    ),
    Builtin {
        name: "group_by",
        family: Family::Table,
        params: &[req("table", "table"), req("key", "string")],
        variadic: true,
        returns: "grouped table",
        summary: "groups by key columns (more keys as more strings); follow with |> agg(...)",
        example: "print load_csv(\"people.csv\") |> group_by(\"city\") |> agg(n = count(), avg_age = mean(age))",
    },
    table_fn(
        "stats",
        &[
            req("table", "table"),
            opt("stats", "list[string]", "count, mean, std, min, 25%, 50%, 75%, max"),
        ],
        "table",
        "pandas describe() of the numeric columns",
        "print stats(load_csv(\"people.csv\"), [\"mean\", \"std\", \"50%\"])",
    ),
    table_fn(
        "pivot",
        &[
            req("table", "table"),
            req("index", "string"),
            req("columns", "string"),
            req("values", "string"),
            opt("agg", "string", "\"mean\""),
        ],
        "table",
        "pandas pivot_table",
        "print pivot(load_csv(\"people.csv\"), index=\"city\", columns=\"name\", values=\"fare\", agg=\"sum\")",
    ),
    table_fn(
        "join",
        &[
            req("left", "table"),
            req("right", "table"),
            req("on", "string | list[string]"),
            opt("how", "string", "\"inner\" (or \"left\", \"outer\")"),
        ],
        "table",
        "pandas merge on key columns",
        "let t = load_csv(\"people.csv\")\nprint join(t, t |> select([\"name\", \"city\"]), on=\"name\")",
    ),
    table_fn(
        "sort",
        &[req("table", "table"), req("columns", "list[string]"), kw("desc", "bool", Some("false"))],
        "table",
        "rows sorted by columns, stable, missing last",
        "print load_csv(\"people.csv\") |> sort([\"age\"], desc=true)",
    ),
    table_fn(
        "head",
        &[req("table", "table"), opt("n", "int", "5")],
        "table",
        "the first n rows",
        "print load_csv(\"people.csv\") |> head(n=2)",
    ),
    table_fn(
        "distinct",
        TABLE,
        "table",
        "rows without duplicates",
        "print load_csv(\"people.csv\") |> select([\"city\"]) |> distinct",
    ),
    table_fn(
        "value_counts",
        &[req("table", "table"), req("column", "string")],
        "table",
        "each value of a column and its count, most frequent first",
        "print load_csv(\"people.csv\") |> value_counts(\"city\")",
    ),
    table_fn(
        "columns",
        TABLE,
        "list[string]",
        "the column names, a compile-time list",
        "print columns(load_csv(\"people.csv\"))",
    ),
    table_fn(
        "tensor",
        &[req("table", "table"), opt("columns", "list[string]", "every numeric column")],
        "tensor[f64]",
        "a [rows, columns] tensor (missing values NaN)",
        "print tensor(load_csv(\"people.csv\"), [\"age\", \"fare\"]) |> mean(axis=0)",
    ),
    table_fn(
        "plot",
        &[
            req("table", "table"),
            kw("x", "string", None),
            kw("y", "string | list[string]", Some("every numeric column but x")),
            kw("kind", "string", Some("\"line\" (or \"bar\", \"scatter\", \"hist\")")),
            kw("out", "string", None),
            kw("title", "string", Some("none")),
        ],
        "null",
        "a chart written to out (.png or .svg)",
        "load_csv(\"people.csv\") |> plot(x=\"name\", y=\"fare\", kind=\"bar\", out=\"fares.svg\")",
    ),
    // Column-scoped.
    Builtin {
        name: "filter",
        family: Family::ColumnScoped,
        params: &[req("table", "table"), req("cond", "row bool")],
        variadic: false,
        returns: "table",
        summary: "rows where the condition is true (missing is false)",
        example: "print load_csv(\"people.csv\") |> filter(age >= 18 and city == \"Oslo\")",
    },
    Builtin {
        name: "with_column",
        family: Family::ColumnScoped,
        params: &[req("table", "table")],
        variadic: true,
        returns: "table",
        summary: "adds or replaces columns: name = row expression, …",
        example: "print load_csv(\"people.csv\") |> with_column(fare_per_year = fare / age)",
    },
    Builtin {
        name: "agg",
        family: Family::ColumnScoped,
        params: &[req("grouped", "grouped table | table")],
        variadic: true,
        returns: "table",
        summary: "one row per group: name = aggregate(column), …",
        example: "print load_csv(\"people.csv\") |> group_by(\"city\") |> agg(total = sum(fare), oldest = max(age))",
    },
    // Aggregates.
    Builtin {
        name: "count",
        family: Family::Aggregate,
        params: &[opt("column", "column", "none: the group's size")],
        variadic: false,
        returns: "value",
        summary: "rows in the group, or non-missing values of a column",
        example: "print load_csv(\"people.csv\") |> group_by(\"city\") |> agg(n = count())",
    },
    aggregate(
        "sum",
        "sum of a column",
        "print load_csv(\"people.csv\") |> group_by(\"city\") |> agg(total = sum(fare))",
    ),
    aggregate(
        "mean",
        "mean of a column",
        "print load_csv(\"people.csv\") |> group_by(\"city\") |> agg(avg = mean(fare))",
    ),
    aggregate(
        "std",
        "sample standard deviation of a column",
        "print load_csv(\"people.csv\") |> group_by(\"city\") |> agg(s = std(fare))",
    ),
    aggregate(
        "var",
        "sample variance of a column",
        "print load_csv(\"people.csv\") |> group_by(\"city\") |> agg(v = var(fare))",
    ),
    aggregate(
        "min",
        "smallest value of a column",
        "print load_csv(\"people.csv\") |> group_by(\"city\") |> agg(youngest = min(age))",
    ),
    aggregate(
        "max",
        "largest value of a column",
        "print load_csv(\"people.csv\") |> group_by(\"city\") |> agg(oldest = max(age))",
    ),
    aggregate(
        "median",
        "median of a column",
        "print load_csv(\"people.csv\") |> group_by(\"city\") |> agg(m = median(age))",
    ),
    aggregate(
        "first",
        "first value of a column in the group",
        "print load_csv(\"people.csv\") |> group_by(\"city\") |> agg(who = first(name))",
    ),
    aggregate(
        "nunique",
        "number of distinct values of a column",
        "print load_csv(\"people.csv\") |> group_by(\"city\") |> agg(names = nunique(name))",
    ),
    // Row functions.
    row_fn(
        "abs",
        ROW_X,
        "number",
        "absolute value",
        "print load_csv(\"people.csv\") |> with_column(d = abs(age - 30))",
    ),
    row_fn(
        "sqrt",
        ROW_X,
        "f64",
        "square root",
        "print load_csv(\"people.csv\") |> with_column(r = sqrt(fare))",
    ),
    row_fn(
        "exp",
        ROW_X,
        "f64",
        "e^x",
        "print load_csv(\"people.csv\") |> with_column(e = exp(age / 100))",
    ),
    row_fn(
        "log",
        ROW_X,
        "f64",
        "natural logarithm",
        "print load_csv(\"people.csv\") |> with_column(l = log(fare + 1))",
    ),
    row_fn(
        "floor",
        ROW_X,
        "number",
        "rounded down",
        "print load_csv(\"people.csv\") |> with_column(f = floor(fare))",
    ),
    row_fn(
        "ceil",
        ROW_X,
        "number",
        "rounded up",
        "print load_csv(\"people.csv\") |> with_column(c = ceil(fare))",
    ),
    row_fn(
        "round",
        ROW_X,
        "number",
        "rounded to the nearest integer",
        "print load_csv(\"people.csv\") |> with_column(r = round(fare))",
    ),
    row_fn(
        "lower",
        ROW_X,
        "string",
        "lower case",
        "print load_csv(\"people.csv\") |> with_column(n = lower(name))",
    ),
    row_fn(
        "upper",
        ROW_X,
        "string",
        "upper case",
        "print load_csv(\"people.csv\") |> with_column(n = upper(city))",
    ),
    row_fn(
        "len",
        ROW_X,
        "i64",
        "length of a string",
        "print load_csv(\"people.csv\") |> filter(len(name) > 3)",
    ),
    row_fn(
        "contains",
        &[req("x", "row string"), req("part", "string")],
        "bool",
        "whether the string contains part",
        "print load_csv(\"people.csv\") |> filter(contains(name, \"an\"))",
    ),
    row_fn(
        "starts_with",
        &[req("x", "row string"), req("prefix", "string")],
        "bool",
        "whether the string starts with prefix",
        "print load_csv(\"people.csv\") |> filter(starts_with(city, \"O\"))",
    ),
    row_fn(
        "ends_with",
        &[req("x", "row string"), req("suffix", "string")],
        "bool",
        "whether the string ends with suffix",
        "print load_csv(\"people.csv\") |> filter(ends_with(name, \"a\"))",
    ),
    row_fn(
        "is_null",
        ROW_X,
        "bool",
        "whether the value is missing",
        "print load_csv(\"people.csv\") |> filter(is_null(fare))",
    ),
    row_fn(
        "not_null",
        ROW_X,
        "bool",
        "whether the value is present",
        "print load_csv(\"people.csv\") |> filter(not_null(fare))",
    ),
    row_fn(
        "fill_null",
        &[req("x", "row value"), req("value", "value")],
        "value",
        "the value, or a replacement where missing",
        "print load_csv(\"people.csv\") |> with_column(fare = fill_null(fare, 0.0))",
    ),
    row_fn(
        "where",
        &[req("cond", "row bool"), req("a", "row value"), req("b", "row value")],
        "value",
        "a where cond is true, else b",
        "print load_csv(\"people.csv\") |> with_column(adult = where(age >= 18, \"yes\", \"no\"))",
    ),
    row_fn(
        "cast",
        &[req("x", "row value"), req("dtype", "string")],
        "value",
        "converted to \"f64\", \"i64\", \"string\" or \"bool\"",
        "print load_csv(\"people.csv\") |> with_column(a = cast(age, \"f64\"))",
    ),
];

/// Every builtin called `name` (one per family it belongs to).
pub fn lookup(name: &str) -> impl Iterator<Item = &'static Builtin> + '_ {
    BUILTINS.iter().filter(move |b| b.name == name)
}

fn has(name: &str, family: Family) -> bool {
    lookup(name).any(|b| b.family == family)
}

/// A name the checker accepts anywhere as a function (row functions are only names inside
/// row expressions, where every bare name is a column or a function of the row).
pub fn is_builtin(name: &str) -> bool {
    lookup(name).any(|b| b.family != Family::Row)
}

/// Calls the table lowering handles: table functions, and the aggregates that are not
/// also tensor reductions (outside `agg` they report "use it inside agg").
pub fn is_table_call(name: &str) -> bool {
    has(name, Family::Table) || (has(name, Family::Aggregate) && !has(name, Family::Tensor))
}

/// `filter`, `with_column`, `agg`: their arguments after the table name columns bare.
pub fn is_column_scoped(name: &str) -> bool {
    has(name, Family::ColumnScoped)
}

/// Every builtin name callable outside row expressions, for did-you-mean.
pub fn names() -> impl Iterator<Item = &'static str> {
    BUILTINS.iter().filter(|b| b.family != Family::Row).map(|b| b.name)
}
