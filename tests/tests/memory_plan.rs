//! The memory plan, executed: the cpu engine runs the golden programs and a ResNet-style
//! CNN under the default memory policy (`reuse = "in-place"`, `pool = "arena"`, capture),
//! and the bytes it held at its peak — inputs, live values and pooled free buffers — stay
//! within the planned arena (+5%), fused or not.

use std::collections::BTreeMap;

use xpu_engine::options::GraphOptimization;
use xpu_engine::{Assignment, Engine, Execution};
use xpu_engine_cpu::CpuEngine;
use xpu_ir::passes::plan_memory;
use xpu_ir::{Attr, Attrs, DType, Dim, Graph, Op, Tensor, TensorType, ValueId};

fn rand(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            ((s % 2001) as f32 / 1000.0 - 1.0) * 0.2
        })
        .collect()
}

fn inputs(g: &Graph, batch: u64) -> Vec<Tensor> {
    g.inputs
        .iter()
        .enumerate()
        .map(|(i, &v)| {
            let dims: Vec<usize> = g
                .ty(v)
                .dims
                .as_ref()
                .unwrap()
                .iter()
                .map(|d| d.known().unwrap_or(batch) as usize)
                .collect();
            let n = dims.iter().product();
            Tensor::from_vec(dims, rand(n, i as u64 + 1)).unwrap()
        })
        .collect()
}

fn held(e: &Execution) -> u64 {
    e.facts.iter().find(|f| f.key == "memory.peak_held_bytes").unwrap().value.parse().unwrap()
}

/// Runs `g` twice (the second run replays the captured pool) fused and unfused, and checks
/// each run's peak held bytes against the planned arena.
fn check(name: &str, g: &Graph, batch: u64) -> (u64, u64) {
    let bindings = BTreeMap::from([("N".to_string(), batch)]);
    let plan = plan_memory(g, &bindings);
    assert!(plan.unsized_values.is_empty(), "{name}: sizes unknown");
    let planned = plan.arena_bytes;
    let x = inputs(g, batch);
    let mut worst = 0;
    for fuse in [true, false] {
        let mut a = Assignment::new("cpu");
        if !fuse {
            a.options.graph_optimization = Some(GraphOptimization::None);
        }
        let mut exe = CpuEngine.prepare(g, &a).unwrap();
        for run in 0..2 {
            let e = exe.run(&x).unwrap();
            let measured = held(&e);
            assert!(
                measured as f64 <= planned as f64 * 1.05,
                "{name} (fused {fuse}, run {run}): held {measured} bytes, planned arena {planned}; {:?}",
                e.facts.iter().filter(|f| f.node.is_none()).collect::<Vec<_>>()
            );
            worst = worst.max(measured);
        }
    }
    (worst, planned)
}

#[test]
fn the_golden_programs_hold_no_more_than_their_planned_arena() {
    for file in ["convnet", "mlp", "encoder"] {
        let path = format!("{}/programs/{file}.sgr", env!("CARGO_MANIFEST_DIR"));
        let g = xpu_ir::text::parse(&std::fs::read_to_string(&path).unwrap()).unwrap();
        let (measured, planned) = check(file, &g, 4);
        eprintln!("{file}: measured peak {measured} bytes, planned arena {planned} bytes");
    }
}

#[test]
fn a_resnet_style_cnn_holds_no_more_than_its_planned_arena() {
    let g = resnet_like();
    let (measured, planned) = check("resnet-like", &g, 2);
    eprintln!("resnet-like: measured peak {measured} bytes, planned arena {planned} bytes");
}

/// A ResNet-18-shaped CNN at 64×64 (weights as constants): a strided stem, a max pool, two
/// stages of two basic blocks (the second stage strided, with a 1×1 projection), global
/// average pooling and a dense layer.
fn resnet_like() -> Graph {
    let mut g = Graph::new("resnet-like");
    let ty = TensorType::new(
        DType::F32,
        vec![Dim::Sym("N".into()), Dim::Known(3), Dim::Known(64), Dim::Known(64)],
    );
    let x = g.add_input("x", ty);
    let mut seed = 10;
    let mut conv = |g: &mut Graph, x: ValueId, cin: usize, cout: usize, k: usize, stride: i64| {
        seed += 2;
        let w = g.add_const(
            Tensor::from_vec(vec![cout, cin, k, k], rand(cout * cin * k * k, seed)).unwrap(),
        );
        let b = g.add_const(Tensor::from_vec(vec![cout], rand(cout, seed + 1)).unwrap());
        let p = (k / 2) as i64;
        let attrs = Attrs::new()
            .with("pads", Attr::Ints(vec![p; 4]))
            .with("strides", Attr::Ints(vec![stride; 2]));
        g.add_op(Op::Conv, &[x, w, b], attrs).unwrap()
    };
    let relu = |g: &mut Graph, x| g.add_op(Op::Relu, &[x], Attrs::new()).unwrap();
    let stem = conv(&mut g, x, 3, 16, 7, 2);
    let stem = relu(&mut g, stem);
    let pool = Attrs::new()
        .with("kernel_shape", Attr::Ints(vec![3, 3]))
        .with("strides", Attr::Ints(vec![2, 2]))
        .with("pads", Attr::Ints(vec![1; 4]));
    let mut h = g.add_op(Op::MaxPool, &[stem], pool).unwrap();
    let mut cin = 16;
    for (width, stride) in [(16, 1), (32, 2)] {
        for block in 0..2 {
            let s = if block == 0 { stride } else { 1 };
            let a = conv(&mut g, h, cin, width, 3, s);
            let a = relu(&mut g, a);
            let b = conv(&mut g, a, width, width, 3, 1);
            let short = if cin != width || s != 1 { conv(&mut g, h, cin, width, 1, s) } else { h };
            let sum = g.add_op(Op::Add, &[b, short], Attrs::new()).unwrap();
            h = relu(&mut g, sum);
            cin = width;
        }
    }
    let gap = g.add_op(Op::GlobalAveragePool, &[h], Attrs::new()).unwrap();
    let flat = g.add_op(Op::Flatten, &[gap], Attrs::new().with("axis", Attr::Int(1))).unwrap();
    let w = g.add_const(Tensor::from_vec(vec![32, 10], rand(320, 99)).unwrap());
    let y = g.add_op(Op::MatMul, &[flat, w], Attrs::new()).unwrap();
    g.add_output("logits", y);
    xpu_ir::verify(&g).unwrap();
    g
}
