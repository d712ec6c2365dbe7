//! Parser tests through one `check` helper: source in, the tree as an S-expression out
//! (precedence and desugaring made visible), plus diagnostics as `line:col CODE`.

use xpu_minilang::ast::*;

fn sexpr(e: &Expr) -> String {
    match &e.kind {
        ExprKind::Int(v) => v.to_string(),
        ExprKind::Float(v) => format!("{v:?}"),
        ExprKind::Str(s) => format!("{s:?}"),
        ExprKind::Bool(b) => b.to_string(),
        ExprKind::Null => "null".into(),
        ExprKind::Name(n) => n.clone(),
        ExprKind::List(items) => {
            format!("[{}]", items.iter().map(sexpr).collect::<Vec<_>>().join(" "))
        }
        ExprKind::Unary { op, expr } => {
            format!("({} {})", if *op == UnOp::Neg { "neg" } else { "not" }, sexpr(expr))
        }
        ExprKind::Binary { op, lhs, rhs } => {
            format!("({} {} {})", op.symbol(), sexpr(lhs), sexpr(rhs))
        }
        ExprKind::Range { start, end } => format!("(.. {} {})", sexpr(start), sexpr(end)),
        ExprKind::Call { callee, args, piped } => {
            let args: Vec<String> = args
                .iter()
                .map(|a| match &a.name {
                    Some(n) => format!("{}={}", n.name, sexpr(&a.value)),
                    None => sexpr(&a.value),
                })
                .collect();
            format!("({}{} {})", if *piped { "|> " } else { "" }, sexpr(callee), args.join(" "))
        }
        ExprKind::Index { target, items } => {
            let items: Vec<String> = items
                .iter()
                .map(|i| match i {
                    IndexItem::At(e) => sexpr(e),
                    IndexItem::Slice { start, end } => format!(
                        "{}:{}",
                        start.as_ref().map(sexpr).unwrap_or_default(),
                        end.as_ref().map(sexpr).unwrap_or_default()
                    ),
                })
                .collect();
            format!("(index {} {})", sexpr(target), items.join(" "))
        }
        ExprKind::Field { target, name } => format!("(. {} {})", sexpr(target), name.name),
        ExprKind::If { cond, then, otherwise } => format!(
            "(if {} {}{})",
            sexpr(cond),
            block(then),
            otherwise.as_ref().map(|b| format!(" {}", block(b))).unwrap_or_default()
        ),
        ExprKind::Error => "ERR".into(),
    }
}

fn block(b: &Block) -> String {
    format!("{{{}}}", b.stmts.iter().map(stmt).collect::<Vec<_>>().join("; "))
}

fn stmt(s: &Stmt) -> String {
    match &s.kind {
        StmtKind::Let { mutable, name, value } => {
            format!("(let{} {} {})", if *mutable { " mut" } else { "" }, name.name, sexpr(value))
        }
        StmtKind::Assign { name, value } => format!("(= {} {})", name.name, sexpr(value)),
        StmtKind::Fn { name, params, body } => format!(
            "(fn {} ({}) {})",
            name.name,
            params
                .iter()
                .map(|p| match &p.default {
                    Some(d) => format!("{}={}", p.name.name, sexpr(d)),
                    None => p.name.name.clone(),
                })
                .collect::<Vec<_>>()
                .join(" "),
            block(body)
        ),
        StmtKind::For { var, iter, body } => {
            format!("(for {} {} {})", var.name, sexpr(iter), block(body))
        }
        StmtKind::Print(e) => format!("(print {})", sexpr(e)),
        StmtKind::Expr(e) => sexpr(e),
    }
}

/// Parser only: `expect` is the statements, one per line, then `-- line:col CODE` lines.
fn check(src: &str, expect: &str) {
    let (program, diags) = xpu_minilang::parser::parse(src);
    compare(src, &program, &diags, expect);
}

/// Parser and name checks (`xpu_minilang::analyze`).
fn check_analyzed(src: &str, expect: &str) {
    let (program, diags) = xpu_minilang::analyze(src);
    compare(src, &program, &diags, expect);
}

fn compare(src: &str, program: &Program, diags: &[xpu_minilang::Diagnostic], expect: &str) {
    let mut got: Vec<String> = program.stmts.iter().map(stmt).collect();
    for d in diags {
        let (l, c) = d.line_col(src);
        got.push(format!("-- {l}:{c} {}", d.code));
    }
    let want: Vec<&str> = expect.lines().map(str::trim).filter(|l| !l.is_empty()).collect();
    assert_eq!(
        got,
        want,
        "source:\n{src}\nrendered:\n{}",
        xpu_minilang::render("t.ml", src, diags)
    );
}

#[test]
fn the_seed_example() {
    check_analyzed(
        "# example.ml\nlet data = load_csv(\"titanic.csv\")\nprint stats(data, [\"mean\", \"std\", \"50%\"])\n",
        r#"(let data (load_csv "titanic.csv"))
           (print (stats data ["mean" "std" "50%"]))"#,
    );
}

#[test]
fn precedence() {
    check("print 1 + 2 * 3 - 4", "(print (- (+ 1 (* 2 3)) 4))");
    check("print -2 ** 2", "(print (neg (** 2 2)))");
    check("print 2 ** 3 ** 2", "(print (** 2 (** 3 2)))");
    check("print a @ b * c", "(print (* (@ a b) c))");
    check("print a or b and not c == d", "(print (or a (and b (not (== c d)))))");
    check("print 1 + 2 < 3 * 4", "(print (< (+ 1 2) (* 3 4)))");
    check("print x % 2 == 0", "(print (== (% x 2) 0))");
    check("for i in 0..n + 1 { print i }", "(for i (.. 0 (+ n 1)) {(print i)})");
}

#[test]
fn pipelines_calls_and_indexing() {
    check(
        "let a = data\n  |> filter(Age >= 18 and Sex == \"female\")\n  |> head(5)",
        r#"(let a (|> head (|> filter data (and (>= Age 18) (== Sex "female"))) 5))"#,
    );
    check("print t |> sum", "(print (|> sum t))");
    check("print f(x, axis=1, keep=true)", "(print (f x axis=1 keep=true))");
    check("print t[0:5, 1]", "(print (index t 0:5 1))");
    check("print t[:, :2]", "(print (index t : :2))");
    check("print df.Age + df[\"Fare\"]", "(print (+ (. df Age) (index df \"Fare\")))");
    check("print [[1.0, 2.0], [3.0, 4.0]]", "(print [[1.0 2.0] [3.0 4.0]])");
    check("print f(\n  1,\n  2,\n)", "(print (f 1 2))");
}

#[test]
fn statements() {
    check("let mut x = 1\nx = x + 1; print x", "(let mut x 1)\n(= x (+ x 1))\n(print x)");
    check(
        "fn scale(x, k=2) {\n  x * k\n}\nprint scale(3)",
        "(fn scale (x k=2) {(* x k)})\n(print (scale 3))",
    );
    check(
        "let s = if a > 1 { \"big\" } else if a > 0 { \"small\" }\nelse { \"none\" }",
        r#"(let s (if (> a 1) {"big"} {(if (> a 0) {"small"} {"none"})}))"#,
    );
    check("let s = \"tab\\there \\\"q\\\"\"", r#"(let s "tab\there \"q\"")"#);
    check("print null == true", "(print (== null true))");
    // Inside brackets newlines are whitespace: `else` may start the next line there too.
    check("print f(if a { 1 }\n  else { 2 })", "(print (f (if a {1} {2})))");
}

#[test]
fn errors_are_located_and_parsing_goes_on() {
    check_analyzed("let = 5\nprint 1", "(print 1)\n-- 1:5 E0004");
    check_analyzed("print (1 + \nprint 2", "(print ERR)\n(print 2)\n-- 2:1 E0004");
    check_analyzed("let x = 1\nx = 2", "(let x 1)\n(= x 2)\n-- 2:1 E0101");
    check_analyzed("print y", "(print y)\n-- 1:7 E0100");
    check_analyzed("print 1 $ 2\nprint 3", "(print 1)\n(print 3)\n-- 1:9 E0001");
    check_analyzed("print \"open", "(print ERR)\n-- 1:7 E0002");
    check_analyzed("print 99999999999999999999", "(print ERR)\n-- 1:7 E0005");
    check_analyzed("print 1 < 2 < 3", "(print (< 1 2))\n-- 1:13 E0008");
    check_analyzed("print f(a=1, 2)", "(print (f a=1 2))\n-- 1:14 E0104");
    check_analyzed("print 1 |> 2", "(print ERR)\n-- 1:12 E0105");
    check_analyzed("fn f(n) { f(n - 1) }", "(fn f (n) {(f (- n 1))})\n-- 1:11 E0102");
    check_analyzed("}\nprint 1", "(print 1)\n-- 1:1 E0006");
    check_analyzed("fn f() { print 1", "(fn f () {(print 1)})\n-- 1:17 E0006");
    check_analyzed("let a = [1, 2", "(let a ERR)\n-- 1:14 E0004");
    // Column names inside filter/with_column/agg are not program names.
    check_analyzed(
        "let t = 1\nprint filter(t, Agee > 1)",
        "(let t 1)\n(print (filter t (> Agee 1)))",
    );
    // An unknown callee is reported once; its arguments are not checked on top.
    check_analyzed("print filterr(t)", "(print (filterr t))\n-- 1:7 E0100");
}
