//! A loaded policy's resolved form: selectors typed once, each cited key with its line.

use xpu_ir::{DType, Op, OpClass};
use xpu_policy::{KernelPick, Key, Loader};

const POLICY: &str = r#"[policy]
name = "resolved"

[engines]
order = ["ort", "cpu"]
deny = ["cuda"]

[precision]
default = "bf16"
keep_fp32 = ["softmax", "norm"]

[kernels]
conv = "cpu.im2col_conv"
matmul = ["cpu.blas", "cpu.gemm"]

[[rule]]
name = "big"
when = { class = "matmul", node = "encoder.*", min_flops = 1e6, dtype = "f32" }
kernel = "ort.cpu"

[[rule]]
when = { op = "relu" }
precision = "fp32"
"#;

#[test]
fn selectors_are_typed_and_keys_carry_their_lines() {
    let p = Loader::new().load_text("resolved.toml", None, POLICY).unwrap();
    let r = p.resolved();
    assert_eq!(r.order.iter().map(|e| &**e).collect::<Vec<_>>(), ["ort", "cpu"]);
    assert!(r.is_denied("cuda") && !r.is_denied("cpu"));
    assert!(r.in_order("cpu") && !r.in_order("llvm"));
    // `softmax` names an op and a class: both are kept in fp32; `norm` is a class.
    assert!(r.keep_fp32.contains(Op::Softmax));
    assert!(r.keep_fp32.contains(Op::LogSoftmax));
    assert!(r.keep_fp32.contains(Op::LayerNormalization));
    assert!(!r.keep_fp32.contains(Op::Relu));
    // `[kernels] conv`: the op by its own name, conv_transpose through its class.
    let conv = r.kernels_for(Op::Conv).unwrap();
    assert!(!conv.by_class);
    assert_eq!(conv.pick, KernelPick::Pinned(xpu_engine::KernelId::new("cpu.im2col_conv")));
    assert_eq!(&*conv.site.key, "kernels.conv");
    assert_eq!(&*conv.site.at, "resolved.toml:13");
    assert!(r.kernels_for(Op::ConvTranspose).unwrap().by_class);
    match &r.kernels_for(Op::MatMul).unwrap().pick {
        KernelPick::Prefer(ks) => {
            assert_eq!(ks.iter().map(|k| k.as_str()).collect::<Vec<_>>(), ["cpu.blas", "cpu.gemm"]);
            assert_eq!(ks[0].engine(), "cpu");
        }
        other => panic!("{other:?}"),
    }
    assert!(r.kernels_for(Op::Relu).is_none());
    // Rules: every condition typed; the first match wins.
    let rule = r.rule_for(Op::MatMul, Some("encoder.3.q"), Some(2_000_000), DType::F32).unwrap();
    assert_eq!(&*rule.label, "rule[0] \"big\"");
    assert_eq!(rule.kernel.as_ref().unwrap().engine(), "ort");
    assert_eq!(&*rule.site.at, "resolved.toml:16");
    assert!(rule.places());
    for (op, name, flops, dtype) in [
        (Op::MatMul, Some("decoder.3.q"), Some(2_000_000), DType::F32),
        (Op::MatMul, None, Some(2_000_000), DType::F32),
        (Op::MatMul, Some("encoder.1"), Some(10), DType::F32),
        (Op::MatMul, Some("encoder.1"), None, DType::F32),
        (Op::MatMul, Some("encoder.1"), Some(2_000_000), DType::F16),
        (Op::Add, Some("encoder.1"), Some(2_000_000), DType::F32),
    ] {
        assert!(r.rule_for(op, name, flops, dtype).is_none(), "{op} {name:?} {flops:?} {dtype}");
    }
    let relu = r.rule_for(Op::Relu, None, None, DType::BF16).unwrap();
    assert_eq!((relu.index, &*relu.label), (1, "rule[1]"));
    assert!(!relu.places());
    assert_eq!(&*relu.precision_site.key, "rule[1].precision");
    assert_eq!(&*relu.precision_site.at, "resolved.toml:23");
    assert_eq!(OpClass::MatMul, Op::MatMul.class());
    // Policy-wide keys, each with its line; a key not written cites the file.
    assert_eq!(&*r.site(Key::PrecisionDefault).at, "resolved.toml:9");
    assert_eq!(&*r.site(Key::EnginesDeny).at, "resolved.toml:6");
    assert_eq!(&*r.site(Key::MemoryLimit).key, "memory.limit");
    for k in Key::ALL {
        assert!(!r.site(k).at.is_empty(), "{}", k.name());
    }
}
