//! Garbage input: mutated programs and random bytes never panic, every diagnostic's span
//! lies inside the source, and rendering never fails.

const SEEDS: &[&str] = &[
    "let x = [[1.0, 2.0], [3.0, 4.0]]\nprint sum(x @ x, axis=1)[0] + reshape(arange(4), [2, 2])[1, :]\n",
    "let mut n = 0\nfor i in 0..9223372036854775807 { n = n + i }\nprint -(-9223372036854775807 - 1) % -1\n",
    "print arange(0, 9223372036854775807, 1)\nprint zeros([100000, 100000])\nprint [1][9223372036854775807]\n",
    "let data = load_csv(\"titanic.csv\")\nprint stats(data, [\"mean\", \"std\", \"50%\"])\n",
    "fn f(a, b=1) { if a > b { a } else { b } }\nfor i in 0..3 { print f(i) }\n",
    "let t = [[1.0, 2.0], [3.0, 4.0]]\nprint t[0:1, :] @ t ** -2 |> sum(axis=0)\n",
    "let mut x = data |> filter(Age >= 18 and not (Sex == \"male\")) |> head(5)\nx = x\n",
];

fn check_one(src: &str) {
    let (program, diags) = xpu_minilang::analyze(src);
    if diags.is_empty() {
        // Lowering either succeeds with a graph that verifies or reports located errors.
        match xpu_minilang::lower::lower(&program, "g", None) {
            Ok(l) => assert!(
                xpu_ir::verify(&l.graph).is_ok(),
                "lowered graph of {src:?} does not verify"
            ),
            Err(ds) => assert!(ds.iter().all(|d| d.span.end <= src.len())),
        }
    }
    for d in &diags {
        assert!(
            d.span.start <= d.span.end && d.span.end <= src.len(),
            "span {:?} outside {} bytes",
            d.span,
            src.len()
        );
        for (s, _) in &d.secondary {
            assert!(s.end <= src.len());
        }
    }
    let _ = xpu_minilang::render("g.ml", src, &diags);
}

#[test]
fn mutated_sources_never_panic() {
    let mut state: u64 = 0x2545F4914F6CDD1D;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let pool: Vec<&str> = vec![
        "(", ")", "[", "]", "{", "}", "|>", "\"", "..", "=", "let", "fn", "if", "else", "\n", ",",
        ":", "**", "é", "\\", "#", "0x", "1e", "@",
    ];
    for round in 0..4000 {
        let mut s = SEEDS[round % SEEDS.len()].to_string();
        for _ in 0..(1 + next() % 6) {
            let mut pos = (next() as usize) % (s.len() + 1);
            while !s.is_char_boundary(pos) {
                pos -= 1;
            }
            match next() % 3 {
                0 => s.insert_str(pos, pool[(next() as usize) % pool.len()]),
                1 => {
                    let mut end = (pos + (next() as usize) % 8).min(s.len());
                    while !s.is_char_boundary(end) {
                        end -= 1;
                    }
                    s.replace_range(pos..end, "");
                }
                _ => s.truncate(pos),
            }
        }
        check_one(&s);
    }
}

#[test]
fn random_text_never_panics() {
    let mut state: u64 = 7;
    for _ in 0..500 {
        let len = (state % 200) as usize;
        let bytes: Vec<u8> = (0..len)
            .map(|_| {
                state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                (state >> 33) as u8
            })
            .collect();
        check_one(&String::from_utf8_lossy(&bytes));
    }
    // Nesting is bounded by the parser, not the stack: 2,000 levels are one clear error.
    for deep in [
        format!("print {}1{}", "(".repeat(2000), ")".repeat(2000)),
        format!("print {}1", "-".repeat(2000)),
        format!("print {}1{}", "[".repeat(2000), "]".repeat(2000)),
        format!("let x = {}1", "not ".repeat(2000)),
        format!("fn f() {{ {} }}", "if a { ".repeat(2000)),
    ] {
        check_one(&deep);
        let (_, diags) = xpu_minilang::analyze(&deep);
        assert!(
            diags.iter().any(|d| d.code == "E0009"),
            "{:?}",
            diags.iter().map(|d| d.code).collect::<Vec<_>>()
        );
    }
}
