//! The cpu executable's memory and fusion behaviour, as a user sees it through the facts of
//! a run: epilogues fused bit-identically, values written in place, buffers reused within a
//! run and kept across runs (`memory.pool`), a replayed capture allocating only what leaves
//! as output, and every setting changing what it says it changes.

use xpu_engine::options::{Capture, GraphOptimization, Pool, Reuse};
use xpu_engine::{Assignment, Engine, Execution};
use xpu_engine_cpu::CpuEngine;
use xpu_ir::{Attr, Attrs, DType, Dim, Graph, Op, Tensor, TensorType, ValueId};

mod common;
use common::rand;

fn konst(g: &mut Graph, shape: &[usize], seed: u64) -> ValueId {
    let n = shape.iter().product();
    g.add_const(Tensor::from_vec(shape.to_vec(), rand(n, seed)).unwrap())
}

fn ints(v: &[i64]) -> Attr {
    Attr::Ints(v.to_vec())
}

/// A ResNet-style block on a batch of `N` images: conv+bias+relu, conv, + residual, relu,
/// max pool, a 1×1 conv, global average pool, flatten, a dense layer (+ bias, relu).
fn resnet_block() -> Graph {
    let mut g = Graph::new("block");
    let ty = TensorType::new(
        DType::F32,
        vec![Dim::Sym("N".into()), Dim::Known(8), Dim::Known(12), Dim::Known(12)],
    );
    let x = g.add_input("x", ty);
    let pad = Attrs::new().with("pads", ints(&[1, 1, 1, 1]));
    let (w1, b1) = (konst(&mut g, &[8, 8, 3, 3], 1), konst(&mut g, &[8], 2));
    let c1 = g.add_op(Op::Conv, &[x, w1, b1], pad.clone()).unwrap();
    let r1 = g.add_op(Op::Relu, &[c1], Attrs::new()).unwrap();
    let w2 = konst(&mut g, &[8, 8, 3, 3], 3);
    let c2 = g.add_op(Op::Conv, &[r1, w2], pad).unwrap();
    let bias = konst(&mut g, &[8, 1, 1], 4);
    let c2b = g.add_op(Op::Add, &[bias, c2], Attrs::new()).unwrap();
    let sum = g.add_op(Op::Add, &[c2b, x], Attrs::new()).unwrap();
    let r2 = g.add_op(Op::Relu, &[sum], Attrs::new()).unwrap();
    let pool_attrs =
        Attrs::new().with("kernel_shape", ints(&[2, 2])).with("strides", ints(&[2, 2]));
    let p = g.add_op(Op::MaxPool, &[r2], pool_attrs).unwrap();
    let w3 = konst(&mut g, &[16, 8, 1, 1], 5);
    let c3 = g.add_op(Op::Conv, &[p, w3], Attrs::new()).unwrap();
    let s3 = g.add_op(Op::Sigmoid, &[c3], Attrs::new()).unwrap();
    let gap = g.add_op(Op::GlobalAveragePool, &[s3], Attrs::new()).unwrap();
    let f = g.add_op(Op::Flatten, &[gap], Attrs::new().with("axis", Attr::Int(1))).unwrap();
    let (w4, b4) = (konst(&mut g, &[16, 10], 6), konst(&mut g, &[10], 7));
    let m = g.add_op(Op::MatMul, &[f, w4], Attrs::new()).unwrap();
    let mb = g.add_op(Op::Add, &[m, b4], Attrs::new()).unwrap();
    let y = g.add_op(Op::Relu, &[mb], Attrs::new()).unwrap();
    g.add_output("y", y);
    xpu_ir::verify(&g).unwrap();
    g
}

fn input(batch: usize) -> Tensor {
    Tensor::from_vec(vec![batch, 8, 12, 12], rand(batch * 8 * 144, 9)).unwrap()
}

fn assignment(f: impl FnOnce(&mut xpu_engine::EngineOptions)) -> Assignment {
    let mut a = Assignment::new("cpu");
    f(&mut a.options);
    a
}

fn fact<'e>(e: &'e Execution, key: &str) -> &'e str {
    e.facts
        .iter()
        .find(|f| f.key == key && f.node.is_none())
        .map(|f| f.value.as_str())
        .unwrap_or_else(|| panic!("no fact {key}: {:?}", e.facts))
}

fn count(e: &Execution, key: &str) -> u64 {
    fact(e, key).parse().unwrap()
}

fn bits(t: &Tensor) -> Vec<u32> {
    t.as_slice::<f32>().unwrap().iter().map(|v| v.to_bits()).collect()
}

#[test]
fn fused_epilogues_give_the_unfused_results_bit_for_bit() {
    let g = resnet_block();
    let x = [input(3)];
    let fused = CpuEngine.prepare(&g, &Assignment::new("cpu")).unwrap().run(&x).unwrap();
    let plain = assignment(|o| o.graph_optimization = Some(GraphOptimization::None));
    let unfused = CpuEngine.prepare(&g, &plain).unwrap().run(&x).unwrap();
    assert_eq!(bits(&fused.outputs[0]), bits(&unfused.outputs[0]));
    // conv+relu, conv+add+add+relu, conv+sigmoid, matmul+add+relu: four fused steps.
    let fused_facts: Vec<&str> = fused
        .facts
        .iter()
        .filter(|f| f.key == "fused" && f.value.starts_with("epilogue"))
        .map(|f| f.value.as_str())
        .collect();
    assert_eq!(
        fused_facts,
        ["epilogue relu", "epilogue add + add + relu", "epilogue sigmoid", "epilogue add + relu"]
    );
    assert!(
        unfused.facts.iter().all(|f| f.key != "fused"),
        "graph_optimization = none fuses nothing"
    );
    // Every node keeps a timing; absorbed ones say where they ran.
    assert_eq!(fused.timings.len(), g.nodes.len());
    let absorbed =
        fused.facts.iter().filter(|f| f.key == "fused" && f.value.starts_with("into")).count();
    assert_eq!(absorbed, 7);
}

#[test]
fn a_fused_residual_computed_after_the_anchor_is_read_when_ready() {
    // y = relu(conv(x) + exp(x)): the residual is computed after the conv node.
    let mut g = Graph::new("late");
    let x = g.add_input("x", TensorType::of_shape(DType::F32, &[2, 4, 5, 5]));
    let w = konst(&mut g, &[4, 4, 1, 1], 1);
    let c = g.add_op(Op::Conv, &[x, w], Attrs::new()).unwrap();
    let e = g.add_op(Op::Exp, &[x], Attrs::new()).unwrap();
    let s = g.add_op(Op::Add, &[c, e], Attrs::new()).unwrap();
    let y = g.add_op(Op::Relu, &[s], Attrs::new()).unwrap();
    g.add_output("y", y);
    let x = [Tensor::from_vec(vec![2, 4, 5, 5], rand(200, 3)).unwrap()];
    let fused = CpuEngine.prepare(&g, &Assignment::new("cpu")).unwrap().run(&x).unwrap();
    let plain = assignment(|o| o.graph_optimization = Some(GraphOptimization::Basic));
    let unfused = CpuEngine.prepare(&g, &plain).unwrap().run(&x).unwrap();
    assert_eq!(bits(&fused.outputs[0]), bits(&unfused.outputs[0]));
    assert!(fused.facts.iter().any(|f| f.value == "epilogue add + relu"), "{:?}", fused.facts);
}

#[test]
fn elementwise_nodes_write_over_operands_that_die_there() {
    // exp(x) -> tanh -> * 2 -> - 1: each result can take its operand's buffer.
    let mut g = Graph::new("chain");
    let x = g.add_input("x", TensorType::of_shape(DType::F32, &[64, 64]));
    let e = g.add_op(Op::Exp, &[x], Attrs::new()).unwrap();
    let t = g.add_op(Op::Tanh, &[e], Attrs::new()).unwrap();
    let two = g.add_const(Tensor::scalar(2.0f32));
    let m = g.add_op(Op::Mul, &[two, t], Attrs::new()).unwrap();
    let one = g.add_const(Tensor::scalar(1.0f32));
    let y = g.add_op(Op::Sub, &[m, one], Attrs::new()).unwrap();
    g.add_output("y", y);
    let x = [Tensor::from_vec(vec![64, 64], rand(4096, 5)).unwrap()];
    let in_place = CpuEngine.prepare(&g, &Assignment::new("cpu")).unwrap().run(&x).unwrap();
    let buffers = assignment(|o| o.memory_reuse = Reuse::Buffers);
    let reused = CpuEngine.prepare(&g, &buffers).unwrap().run(&x).unwrap();
    let none = assignment(|o| o.memory_reuse = Reuse::None);
    let fresh = CpuEngine.prepare(&g, &none).unwrap().run(&x).unwrap();
    for e in [&reused, &fresh] {
        assert_eq!(bits(&in_place.outputs[0]), bits(&e.outputs[0]));
    }
    assert_eq!(count(&in_place, "memory.in_place"), 3, "tanh, mul and sub write in place");
    assert_eq!(count(&reused, "memory.in_place"), 0);
    assert_eq!(count(&fresh, "memory.in_place"), 0);
    assert_eq!(count(&fresh, "memory.reused_buffers"), 0, "reuse = none reuses nothing");
    let (held_in_place, held_fresh) =
        (count(&in_place, "memory.peak_held_bytes"), count(&fresh, "memory.peak_held_bytes"));
    assert!(held_in_place < held_fresh, "{held_in_place} vs {held_fresh}");
}

#[test]
fn a_kept_pool_serves_a_repeated_run_and_a_replayed_capture_allocates_only_outputs() {
    let g = resnet_block();
    let x = [input(2)];
    let mut exe = CpuEngine.prepare(&g, &Assignment::new("cpu")).unwrap();
    let first = exe.run(&x).unwrap();
    assert!(fact(&first, "capture").starts_with("recorded"), "{:?}", first.facts);
    assert!(count(&first, "memory.allocated_buffers") > 1);
    for _ in 0..3 {
        let again = exe.run(&x).unwrap();
        assert_eq!(bits(&again.outputs[0]), bits(&first.outputs[0]));
        assert_eq!(
            fact(&again, "capture"),
            "replayed (0 buffer requests off their recorded buffer)"
        );
        // The one output leaves with the caller; everything else comes from the pool.
        assert_eq!(count(&again, "memory.allocated_buffers"), 1, "{:?}", again.facts);
        assert_eq!(count(&again, "memory.kernel_allocations"), 0, "{:?}", again.facts);
    }
    // A new batch size records again, and the pool is rebuilt for it.
    let bigger = exe.run(&[input(5)]).unwrap();
    assert!(
        fact(&bigger, "capture").contains("input shapes changed (1 re-captures)"),
        "{:?}",
        bigger.facts
    );
    assert_eq!(
        bits(&bigger.outputs[0])[..20],
        bits(
            &CpuEngine
                .prepare(&g, &Assignment::new("cpu"))
                .unwrap()
                .run(&[input(5)])
                .unwrap()
                .outputs[0]
        )[..20]
    );
}

#[test]
fn pool_none_and_eager_capture_do_what_they_say() {
    let g = resnet_block();
    let x = [input(2)];
    let none = assignment(|o| o.memory_pool = Pool::None);
    let mut exe = CpuEngine.prepare(&g, &none).unwrap();
    exe.run(&x).unwrap();
    let again = exe.run(&x).unwrap();
    assert!(count(&again, "memory.allocated_buffers") > 1, "memory.pool = none keeps nothing");
    assert!(again.facts.iter().all(|f| f.key != "capture"), "nothing to replay without a pool");
    let eager = assignment(|o| o.capture = Capture::Eager);
    let mut exe = CpuEngine.prepare(&g, &eager).unwrap();
    let first = exe.run(&x).unwrap();
    let again = exe.run(&x).unwrap();
    assert!(again.facts.iter().all(|f| f.key != "capture"));
    // Best fit over the kept pool: most requests are served, though without a recorded
    // assignment an early request can take a buffer a later one would have fitted.
    let (before, after) =
        (count(&first, "memory.allocated_buffers"), count(&again, "memory.allocated_buffers"));
    assert!(after < before, "{after} vs {before}");
}

#[test]
fn an_arena_is_rebuilt_for_new_shapes_and_a_caching_pool_keeps_its_buffers() {
    let g = resnet_block();
    let allocations_after_shrinking = |pool: Pool| {
        let mut exe = CpuEngine.prepare(&g, &assignment(|o| o.memory_pool = pool)).unwrap();
        exe.run(&[input(6)]).unwrap();
        count(&exe.run(&[input(2)]).unwrap(), "memory.allocated_buffers")
    };
    // The caching pool serves the smaller batch from the larger batch's buffers (only the
    // output is new); the arena drops them and is built again at the new size.
    assert_eq!(allocations_after_shrinking(Pool::Caching), 1);
    assert!(allocations_after_shrinking(Pool::Arena) > 1);
}

#[test]
fn a_memory_limit_counts_the_live_values() {
    let g = resnet_block();
    let tight = assignment(|o| o.memory_limit = Some(40_000));
    let err = CpuEngine.prepare(&g, &tight).unwrap().run(&[input(4)]).unwrap_err();
    assert_eq!(err.code(), "memory_limit", "{err}");
    let roomy = assignment(|o| o.memory_limit = Some(10_000_000));
    CpuEngine.prepare(&g, &roomy).unwrap().run(&[input(4)]).unwrap();
}

#[test]
fn two_products_meeting_in_one_add_fuse_into_one_of_them() {
    // relu(conv(x, w1) + conv(x, w2)), the projection shortcut of a ResNet block, and the
    // gate of a recurrent cell, relu(x·W + h·U): the add may join one product's epilogue
    // (the other product its residual), never both.
    let mut g = Graph::new("two");
    let x = g.add_input("x", TensorType::of_shape(DType::F32, &[2, 3, 6, 6]));
    let (w1, w2) = (konst(&mut g, &[4, 3, 3, 3], 1), konst(&mut g, &[4, 3, 1, 1], 2));
    let pad = Attrs::new().with("pads", ints(&[1, 1, 1, 1]));
    let a = g.add_op(Op::Conv, &[x, w1], pad).unwrap();
    let b = g.add_op(Op::Conv, &[x, w2], Attrs::new()).unwrap();
    let s = g.add_op(Op::Add, &[a, b], Attrs::new()).unwrap();
    let y = g.add_op(Op::Relu, &[s], Attrs::new()).unwrap();
    let flat = g.add_op(Op::Flatten, &[y], Attrs::new().with("axis", Attr::Int(1))).unwrap();
    let (u, v) = (konst(&mut g, &[144, 8], 3), konst(&mut g, &[144, 8], 4));
    let p = g.add_op(Op::MatMul, &[flat, u], Attrs::new()).unwrap();
    let q = g.add_op(Op::MatMul, &[flat, v], Attrs::new()).unwrap();
    let gate = g.add_op(Op::Add, &[p, q], Attrs::new()).unwrap();
    let out = g.add_op(Op::Sigmoid, &[gate], Attrs::new()).unwrap();
    g.add_output("y", out);
    xpu_ir::verify(&g).unwrap();
    let x = [Tensor::from_vec(vec![2, 3, 6, 6], rand(216, 8)).unwrap()];
    let fused = CpuEngine.prepare(&g, &Assignment::new("cpu")).unwrap().run(&x).unwrap();
    let plain = assignment(|o| o.graph_optimization = Some(GraphOptimization::None));
    let unfused = CpuEngine.prepare(&g, &plain).unwrap().run(&x).unwrap();
    assert_eq!(bits(&fused.outputs[0]), bits(&unfused.outputs[0]));
    let epilogues: Vec<&str> = fused
        .facts
        .iter()
        .filter(|f| f.value.starts_with("epilogue"))
        .map(|f| f.value.as_str())
        .collect();
    assert_eq!(epilogues, ["epilogue add + relu", "epilogue add + sigmoid"]);
}

#[test]
fn hostile_pooling_and_convolution_geometry_is_an_error() {
    let pool = |kernel: &[i64], pads: &[i64], dims: [u64; 4]| {
        let mut g = Graph::new("p");
        let x = g.add_input(
            "x",
            TensorType::new(DType::F32, dims.iter().map(|&d| Dim::Known(d)).collect()),
        );
        let attrs = Attrs::new().with("kernel_shape", ints(kernel)).with("pads", ints(pads));
        let n = g.add_node(
            Op::MaxPool,
            vec![Some(x)],
            attrs,
            vec![TensorType::new(DType::F32, vec![Dim::Unknown; 4])],
        );
        let y = g.nodes[n.index()].outputs[0];
        g.add_output("y", y);
        let input = Tensor::zeros(DType::F32, dims.iter().map(|&d| d as usize).collect());
        CpuEngine.prepare(&g, &Assignment::new("cpu")).unwrap().run(&[input]).map(|_| ())
    };
    for (kernel, pads) in [
        (vec![0, 2], vec![0; 4]),
        (vec![-1, 2], vec![0; 4]),
        (vec![1, 1], vec![0, 0, 1 << 40, 1 << 40]),
        (vec![2, 2], vec![0, 0, -1, 0]),
    ] {
        let err = pool(&kernel, &pads, [1, 1, 4, 4]).unwrap_err();
        assert_eq!(err.code(), "kernel", "{kernel:?} {pads:?}: {err}");
    }
}

#[test]
fn nodes_of_constant_inputs_are_computed_once_at_prepare() {
    // bf16 weights cast from an f32 constant, as a bf16 policy plans them on the cpu: the
    // cast runs once, when the executable is prepared, and the product is the same as with
    // the weights given as an input (cast on every run).
    let build = |weights_as_input: bool| {
        let mut g = Graph::new("cast");
        let x = g.add_input("x", TensorType::of_shape(DType::F32, &[4, 8]));
        let w = if weights_as_input {
            g.add_input("w", TensorType::of_shape(DType::F32, &[8, 6]))
        } else {
            konst(&mut g, &[8, 6], 3)
        };
        let to_bf16 = || Attrs::new().with("to", Attr::DType(DType::BF16));
        let wc = g.add_op(Op::Cast, &[w], to_bf16()).unwrap();
        let xc = g.add_op(Op::Cast, &[x], to_bf16()).unwrap();
        let y = g.add_op(Op::MatMul, &[xc, wc], Attrs::new()).unwrap();
        g.add_output("y", y);
        g
    };
    let x = Tensor::from_vec(vec![4, 8], rand(32, 5)).unwrap();
    let w = Tensor::from_vec(vec![8, 6], rand(48, 3)).unwrap();
    let hoisted = CpuEngine
        .prepare(&build(false), &Assignment::new("cpu"))
        .unwrap()
        .run(std::slice::from_ref(&x))
        .unwrap();
    let each_run =
        CpuEngine.prepare(&build(true), &Assignment::new("cpu")).unwrap().run(&[x, w]).unwrap();
    assert_eq!(hoisted.outputs[0], each_run.outputs[0]);
    let prepacked: Vec<_> =
        hoisted.facts.iter().filter(|f| f.key == "prepacked").map(|f| f.node).collect();
    assert_eq!(prepacked, [Some(xpu_ir::NodeId(1))], "the weight cast, not the input's");
    assert!(each_run.facts.iter().all(|f| f.key != "prepacked"));
}
