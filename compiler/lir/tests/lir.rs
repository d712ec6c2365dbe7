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

mod interpreter {
    use xpu_lir::interp::{Value, run};
    use xpu_lir::parse;

    fn kernel(path: &str, name: &str) -> xpu_lir::Kernel {
        let dir =
            std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/filetests/lir");
        let m = parse(&std::fs::read_to_string(dir.join(path)).unwrap()).unwrap();
        xpu_lir::verify(&m).unwrap();
        m.kernels.into_iter().find(|k| k.name == name).unwrap()
    }

    fn f32s(v: &[Value]) -> Vec<f32> {
        v.iter().map(|x| if let Value::F32(f) = x { *f } else { panic!("{x:?}") }).collect()
    }

    #[test]
    fn softmax_rows_match_the_formula_and_keep_nan_rows_nan() {
        let k = kernel("softmax.lir", "softmax_rows");
        let n = 3;
        let mut x: Vec<f32> = (0..n * 1000).map(|i| ((i * 37 % 101) as f32 - 50.0) / 7.0).collect();
        x[2 * 1000 + 5] = f32::NAN;
        let mut bufs =
            vec![x.iter().map(|&v| Value::F32(v)).collect(), vec![Value::F32(0.0); n * 1000]];
        run(&k, &[n as i64], &mut bufs).unwrap();
        let y = f32s(&bufs[1]);
        for r in 0..2 {
            let row = &x[r * 1000..][..1000];
            let m = row.iter().fold(f64::NEG_INFINITY, |a, &v| a.max(v as f64));
            let s: f64 = row.iter().map(|&v| (v as f64 - m).exp()).sum();
            for j in 0..1000 {
                let want = (row[j] as f64 - m).exp() / s;
                assert!((y[r * 1000 + j] as f64 - want).abs() < 1e-6, "row {r} col {j}");
            }
        }
        assert!(
            y[2000..].iter().all(|v| v.is_nan()),
            "a NaN in a row makes its max, and so the row, NaN"
        );
    }

    #[test]
    fn lanes_fix_the_order_of_a_float_sum() {
        // 1e8 + 1 + 1 + … in one lane loses every 1; in two lanes the ones land in lane 1
        // (k odd) and survive until the final combine.
        let src = |lanes: u32| {
            format!(
                "kernel @s(%x: f32[4] in, %y: f32[] out) {{\n  %r = reduce add : f32 lanes {lanes} init 0.0 for %j in 0..4 {{\n    %a = load %x[%j]\n    yield %a\n  }}\n  store %y[], %r\n}}\n"
            )
        };
        let x = [1e8f32, 1.0, 0.0, 1.0];
        let mut sums = Vec::new();
        for lanes in [1, 2] {
            let m = parse(&src(lanes)).unwrap();
            xpu_lir::verify(&m).unwrap();
            let mut bufs = vec![x.iter().map(|&v| Value::F32(v)).collect(), vec![Value::F32(0.0)]];
            run(&m.kernels[0], &[], &mut bufs).unwrap();
            sums.push(f32s(&bufs[1])[0]);
        }
        assert_eq!(sums, [1e8, 1e8 + 2.0]);
    }

    #[test]
    fn gelu_chain_is_bit_exact_in_f32_and_storage_types_round() {
        let k = kernel("bias_gelu.lir", "bias_gelu_tanh");
        let x: Vec<f32> = (0..2 * 64).map(|i| (i as f32 - 64.0) / 16.0).collect();
        let b: Vec<f32> = (0..64).map(|i| i as f32 / 128.0).collect();
        let mut bufs = vec![
            x.iter().map(|&v| Value::F32(v)).collect(),
            b.iter().map(|&v| Value::F32(v)).collect(),
            vec![Value::F32(0.0); 128],
        ];
        run(&k, &[2], &mut bufs).unwrap();
        let y = f32s(&bufs[2]);
        for i in 0..128 {
            let v = x[i] + b[i % 64];
            let t = xpu_lir::math::tanhf((v + v * v * v * 0.044715f32) * 0.797_884_6f32);
            assert_eq!(y[i].to_bits(), (v * (t + 1.0) * 0.5).to_bits(), "element {i}");
        }
        let k = kernel("bias_gelu.lir", "strided_cast");
        let x: Vec<Value> =
            (0..64).map(|i| Value::F32(if i == 3 { f32::NAN } else { i as f32 - 20.5 })).collect();
        let mut bufs = vec![x, vec![Value::I32(-1); 32]];
        run(&k, &[], &mut bufs).unwrap();
        // Odd columns: max(v, 0) truncated, plus 1 for a NaN (which compares false → 0).
        assert_eq!(bufs[1][1], Value::I32(1), "column 3 is NaN");
        assert_eq!(bufs[1][0], Value::I32(0), "column 1 is −19.5");
        assert_eq!(bufs[1][31], Value::I32(42), "column 63 is 42.5");
    }

    #[test]
    fn bad_bindings_are_errors() {
        let k = kernel("softmax.lir", "softmax_rows");
        let mut bufs = vec![vec![Value::F32(0.0); 10], vec![Value::F32(0.0); 1000]];
        let e = run(&k, &[1], &mut bufs).unwrap_err().to_string();
        assert!(e.contains("%x holds 10 values; its shape needs 1000"), "{e}");
        let e = run(&k, &[-1], &mut bufs).unwrap_err().to_string();
        assert!(e.contains("?n = -1 is negative"), "{e}");
        let mut bufs = vec![vec![Value::I32(0); 1000], vec![Value::F32(0.0); 1000]];
        let e = run(&k, &[1], &mut bufs).unwrap_err().to_string();
        assert!(e.contains("not f32 values"), "{e}");
        let m = parse("kernel @d(%y: i32[] out) {\n  %a = const 1 : i32\n  %z = const 0 : i32\n  %q = div %a, %z\n  store %y[], %q\n}\n").unwrap();
        xpu_lir::verify(&m).unwrap();
        let e = run(&m.kernels[0], &[], &mut [vec![Value::I32(0)]]).unwrap_err().to_string();
        assert!(e.contains("integer division by zero"), "{e}");
        let index = kernel("bias_gelu.lir", "row_index");
        let mut out = vec![vec![Value::I64(0); 15]];
        run(&index, &[], &mut out).unwrap();
        assert_eq!(out[0][0], Value::I64(-1));
        assert_eq!(out[0][14], Value::I64(13));
    }
}
