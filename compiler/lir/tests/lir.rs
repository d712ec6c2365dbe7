//! LIR-ML's text form and verifier: the sample kernels round-trip and verify, every rule
//! of the verifier rejects what it should with a message naming the place, and hostile
//! input (garbage, mutations, deep nesting, huge files) gets an error, never a panic.

use std::path::PathBuf;

use xpu_lir::{Affine, Expr, Kernel, Literal, Module, ScalarType, Stmt, parse, verify};

fn samples() -> Vec<(PathBuf, String)> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/filetests/lir");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("tests/filetests/lir")
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "lir"))
        .collect();
    files.sort();
    assert!(!files.is_empty(), "no .lir samples in {}", dir.display());
    files.into_iter().map(|p| (p.clone(), std::fs::read_to_string(&p).unwrap())).collect()
}

#[test]
fn samples_verify_and_print_back_byte_for_byte() {
    for (path, text) in samples() {
        let module = parse(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        verify(&module).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        assert_eq!(module.to_string(), text, "{} does not print back as written", path.display());
        assert_eq!(parse(&module.to_string()).unwrap(), module, "{}", path.display());
    }
}

/// One case: `src` (a kernel body inside a fixed header, or a whole module when it starts
/// with `kernel`) must fail with a message containing `want`.
fn check(src: &str, want: &str) {
    let text = if src.trim_start().starts_with("kernel") {
        src.to_string()
    } else {
        format!(
            "kernel @k[?n](%x: f32[?n, 8] in, %y: f32[?n, 8] out, %s: f32[] inout) {{\n{src}\n}}\n"
        )
    };
    let got = match parse(&text) {
        Err(e) => e.to_string(),
        Ok(m) => match verify(&m) {
            Err(e) => e.to_string(),
            Ok(()) => "verified".to_string(),
        },
    };
    assert!(got.contains(want), "for\n{src}\nwanted an error containing {want:?}, got {got:?}");
}

#[test]
fn bad_kernels_are_refused_naming_the_place() {
    // Verified: the fixed header with a correct body.
    check(
        "for %i in 0..?n { for %j in 0..8 { %a = load %x[%i, %j]\n store %y[%i, %j], %a } }",
        "verified",
    );
    // Syntax, with positions.
    check("for %i in 0..?n {", "end of input");
    check("%a = frobnicate %b", "2:6: unknown op `frobnicate`");
    check("%a = const 1.0 : f31", "unknown type `f31`");
    check("%a = const 99999999999999999999 : i64", "does not fit in 64 bits");
    check("%a = const 1.0 : f32 $", "unexpected character '$'");
    check("for %i in 0..?n*99999999999*99999999999 {}", "expected");
    check("%a = index %i*9223372036854775807 + %i*9223372036854775807", "overflows i64");
    // Scoping and definitions.
    check("%a = load %s[]\n%a = load %s[]", "%a: defined twice");
    check("store %s[], %ghost", "%ghost is not defined before this use");
    check("for %i in 0..?n { %a = load %x[%i, 0] }\nstore %s[], %a", "used outside the block");
    check("%a = load %x[%i, 0]", "%i is not a symbol of the kernel or a loop index in scope");
    check("%a = load %nope[0, 0]", "no buffer %nope");
    check("for %i in 0..?m {}", "?m is not a symbol");
    // Access and bounds.
    check("%a = load %x[0]", "1 indices for a rank-2 buffer");
    check("for %i in 0..?n { %a = load %y[%i, 0] }", "%y is an `out` buffer");
    check("%a = load %s[]\nfor %i in 0..?n { store %x[%i, 0], %a }", "%x is an `in` buffer");
    check("for %i in 0..?n { %a = load %x[%i, 8] }", "may fall outside 0..8");
    check(
        "for %i in 0..?n { %a = load %x[%i + 1, 0] }",
        "index %i + 1 of dimension 0 may fall outside 0..?n",
    );
    check("for %i in 0..?n { %a = load %x[%i - 1, 0] }", "may fall outside");
    check("for %i in 0..?n { for %j in 0..9 { %a = load %x[%i, %j] } }", "may fall outside 0..8");
    check("%a = load %x[0, 0]", "index 0 of dimension 0 may fall outside 0..?n");
    check("for %r in 0..?n { for %i in 0..4 { %a = load %x[%r, %i*2 + 1] } }", "verified");
    check("for %r in 0..?n { for %i in 0..5 { %a = load %x[%r, %i*2] } }", "may fall outside 0..8");
    // Types.
    check("%a = load %s[]\n%b = const 1 : i32\n%c = add %a, %b", "`add` of f32 and i32");
    check("%a = load %s[]\n%b = not %a", "`not` does not take f32");
    check("%a = const 1 : i64\n%b = exp %a", "`exp` does not take i64");
    check("%a = const 1.5 : i32", "is not a i32 constant");
    check("%a = const true : f32", "is not a f32 constant");
    check("%a = const 3000000000 : i32", "is not a i32 constant");
    check("%a = load %s[]\n%b = select %a, %a, %a", "needs a bool condition");
    check("%a = load %s[]\n%b = cast %a to f16", "f16 is a storage type");
    check("%a = const 1 : i32\nstore %s[], %a", "stores a i32 value into a f32 buffer");
    // Reductions and parallel loops.
    check(
        "%r = reduce add : f32 lanes 0 init 0.0 for %j in 0..8 { %a = load %s[]\n yield %a }",
        "expected a lane count, found `0`",
    );
    check(
        "%r = reduce add : f32 lanes 65 init 0.0 for %j in 0..8 { %a = load %s[]\n yield %a }",
        "65 lanes (1 to 64)",
    );
    check(
        "%r = reduce add : f32 lanes 4 init 0.0 for %j in 0..8 { %a = load %s[] }",
        "must end with `yield`",
    );
    check(
        "%r = reduce add : f32 lanes 4 init 0.0 for %j in 0..8 { %a = const 1 : i64\n yield %a }",
        "yields %a, not a f32",
    );
    check(
        "%r = reduce add : f32 lanes 4 init 0.0 for %j in 0..8 { %a = load %s[]\n store %s[], %a\n yield %a }",
        "a store inside a reduction body",
    );
    check(
        "%r = reduce add : bool lanes 4 init true for %j in 0..8 { %a = const true : bool\n yield %a }",
        "a reduction over bool",
    );
    check("yield %q", "`yield` must be the last statement of a reduction body");
    check(
        "for %i in 0..?n parallel { for %j in 0..8 parallel { } }",
        "a parallel loop inside a parallel loop",
    );
    check("for %i in 0..?n { for %i in 0..8 { } }", "%i is already defined");
    check("for %i in 0 - 1..?n { }", "lower bound -1 can be negative");
    // Module level.
    check("kernel @a() {}\nkernel @a() {}", "a second kernel of this name");
    check("kernel @a[?n, ?n]() {}", "symbol ?n declared twice");
    check("kernel @a(%x: f32[1] in, %x: f32[1] out) {}", "buffer %x declared twice");
    check("kernel @a[?n](%x: f32[?n - 1] in) {}", "extent ?n - 1 can be negative");
}

#[test]
fn every_literal_and_index_form_round_trips() {
    let body = vec![
        Stmt::Let {
            name: "a".into(),
            value: Expr::Const { ty: ScalarType::F64, value: Literal::Float(-0.0) },
        },
        Stmt::Let {
            name: "b".into(),
            value: Expr::Const { ty: ScalarType::F64, value: Literal::Float(f64::NEG_INFINITY) },
        },
        Stmt::Let {
            name: "c".into(),
            value: Expr::Const { ty: ScalarType::F32, value: Literal::Float(1e-39) },
        },
        Stmt::Let {
            name: "d".into(),
            value: Expr::Const { ty: ScalarType::I64, value: Literal::Int(i64::MIN) },
        },
        Stmt::Let {
            name: "e".into(),
            value: Expr::Const { ty: ScalarType::F32, value: Literal::Float(f64::NAN) },
        },
        Stmt::Let { name: "f".into(), value: Expr::Index(Affine::constant(-7)) },
        Stmt::Let {
            name: "g".into(),
            value: Expr::Index(
                Affine::sym("n")
                    .checked_scale(-3)
                    .unwrap()
                    .checked_add(&Affine::constant(2))
                    .unwrap(),
            ),
        },
    ];
    let module = Module {
        kernels: vec![Kernel {
            name: "lits".into(),
            syms: vec!["n".into()],
            buffers: vec![],
            body,
        }],
    };
    verify(&module).unwrap();
    let text = module.to_string();
    let back = parse(&text).unwrap();
    assert_eq!(back.to_string(), text);
    // NaN ≠ NaN, so compare the rest structurally and the NaN by kind.
    let Stmt::Let { value: Expr::Const { value: Literal::Float(x), .. }, .. } =
        &back.kernels[0].body[4]
    else {
        panic!("{text}")
    };
    assert!(x.is_nan());
    assert_eq!(back.kernels[0].body[..4], module.kernels[0].body[..4]);
    assert_eq!(back.kernels[0].body[5..], module.kernels[0].body[5..]);
}

/// Deterministic bytes (xorshift), so a failure reproduces.
fn noise(seed: u64, len: usize) -> Vec<u8> {
    let mut s = seed | 1;
    (0..len)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            s as u8
        })
        .collect()
}

#[test]
fn garbage_and_mutated_kernels_get_errors_not_panics() {
    let (_, sample) = samples().into_iter().next().unwrap();
    for seed in 1..400u64 {
        let garbage = String::from_utf8_lossy(&noise(seed, (seed as usize * 7) % 300)).into_owned();
        if let Ok(m) = parse(&garbage) {
            let _ = verify(&m);
        }
        // A few bytes of the sample replaced, dropped or duplicated.
        let mut bytes = sample.clone().into_bytes();
        let r = noise(seed, 8);
        let at = (r[0] as usize * 256 + r[1] as usize) % bytes.len();
        match r[2] % 3 {
            0 => bytes[at] = b"{}[]%?@,.:=+-*0x9 \n"[r[3] as usize % 19],
            1 => drop(bytes.drain(at..(at + r[3] as usize % 12).min(bytes.len()))),
            _ => {
                let piece: Vec<u8> = bytes[at..(at + r[3] as usize % 40).min(bytes.len())].to_vec();
                bytes.splice(at..at, piece);
            }
        }
        let mutated = String::from_utf8_lossy(&bytes).into_owned();
        if let Ok(m) = parse(&mutated)
            && verify(&m).is_ok()
        {
            let back = parse(&m.to_string()).unwrap();
            assert_eq!(back, m, "a verified mutant must round-trip:\n{mutated}");
        }
    }
}

#[test]
fn deep_nesting_is_refused_and_long_kernels_parse() {
    let deep = format!(
        "kernel @d() {{\n{}{}}}\n",
        "for %i in 0..1 {\n".repeat(100_000),
        "}\n".repeat(100_000)
    );
    let e = parse(&deep).unwrap_err();
    assert!(e.message.contains("nested deeper than 64"), "{e}");
    let long_index = format!("kernel @l() {{\n%a = index {}\n}}\n", vec!["1"; 100_000].join(" + "));
    let m = parse(&long_index).unwrap();
    verify(&m).unwrap();
    assert!(m.to_string().contains("index 100000"), "constants fold into one");
    let body: String = (0..50_000).map(|i| format!("%v{i} = const {i} : i64\n")).collect();
    let m = parse(&format!("kernel @many() {{\n{body}}}\n")).unwrap();
    verify(&m).unwrap();
    assert_eq!(m.kernels[0].body.len(), 50_000);
}
