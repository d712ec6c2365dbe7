//! Stateful sequence ops of linear-attention and state-space models (ONNX opset 27):
//! `linear_attention` (the recurrent form of linear, gated, delta and gated-delta attention)
//! and `causal_conv_with_state` (the depthwise causal convolution Mamba and Gated DeltaNet
//! run before it). Both carry a state across calls for incremental decoding; both compute
//! in f64 and round once to the graph's types.

use ndarray::{ArrayD, IxDyn};
use xpu_ir::{Attrs, Tensor};

use crate::reduce::{from_f64, to_f64};
use crate::util::{KResult, checked_numel, opt, req};

fn shape3(t: &Tensor, what: &str) -> KResult<[usize; 3]> {
    match t.shape() {
        &[a, b, c] => Ok([a, b, c]),
        s => Err(format!("{what} must be rank 3, has shape {s:?}")),
    }
}

fn flat(t: &Tensor) -> KResult<Vec<f64>> {
    Ok(to_f64(t)?.into_iter().collect())
}

fn array(shape: &[usize], v: Vec<f64>) -> KResult<ArrayD<f64>> {
    ArrayD::from_shape_vec(IxDyn(shape), v).map_err(|e| e.to_string())
}

/// The per-token, per-KV-head gate values of `decay` or `beta`: `per` entries for each
/// (batch, token), read at head `h` (and key dim `d` where there is one per key dim).
struct PerToken {
    values: Vec<f64>,
    per: usize,
}

impl PerToken {
    fn at(&self, bt: usize, index: usize) -> f64 {
        self.values[bt * self.per + index]
    }
}

fn per_token(
    t: Option<&Tensor>,
    what: &str,
    bt: [usize; 2],
    allowed: &[usize],
) -> KResult<Option<PerToken>> {
    let Some(t) = t else { return Ok(None) };
    let [b, n, per] = shape3(t, what)?;
    if [b, n] != bt || !allowed.contains(&per) {
        return Err(format!(
            "{what} has shape {:?}; expected [{}, {}, one of {allowed:?}]",
            t.shape(),
            bt[0],
            bt[1]
        ));
    }
    Ok(Some(PerToken { values: flat(t)?, per }))
}

/// The sizes of one linear-attention call.
struct Dims {
    batch: usize,
    tokens: usize,
    hq: usize,
    hkv: usize,
    dk: usize,
    dv: usize,
}

fn linear_attention_dims(attrs: &Attrs, q: &Tensor, k: &Tensor, v: &Tensor) -> KResult<Dims> {
    let (hq, hkv) = (attrs.int("q_num_heads", 0), attrs.int("kv_num_heads", 0));
    if hq <= 0 || hkv <= 0 || hq % hkv != 0 {
        return Err(format!(
            "q_num_heads ({hq}) must be a positive multiple of kv_num_heads ({hkv})"
        ));
    }
    let (hq, hkv) = (hq as usize, hkv as usize);
    let ([b, t, qw], [kb, kt, kw], [vb, vt, vw]) =
        (shape3(q, "query")?, shape3(k, "key")?, shape3(v, "value")?);
    if qw % hq != 0 || vw % hkv != 0 || [kb, kt] != [b, t] || [vb, vt] != [b, t] {
        return Err(format!(
            "query {:?}, key {:?} and value {:?} do not fit {hq} query and {hkv} KV heads",
            q.shape(),
            k.shape(),
            v.shape()
        ));
    }
    let (dk, dv) = (qw / hq, vw / hkv);
    if dk == 0 || dv == 0 {
        return Err(format!("heads of {dk} query and {dv} value dims: each must be ≥ 1"));
    }
    if kw != hkv * dk {
        return Err(format!("key's last dim is {kw}; {hkv} KV heads of {dk} need {}", hkv * dk));
    }
    // The state and the output, allocated below: within the kernel limit.
    checked_numel(&[b, hkv, dk, dv])?;
    checked_numel(&[b, t, hq, dv])?;
    Ok(Dims { batch: b, tokens: t, hq, hkv, dk, dv })
}

pub fn linear_attention(
    attrs: &Attrs,
    inputs: &[Option<&Tensor>],
    n_out: usize,
) -> KResult<Vec<Tensor>> {
    let (q, k, v) = (req(inputs, 0)?, req(inputs, 1)?, req(inputs, 2)?);
    let d = linear_attention_dims(attrs, q, k, v)?;
    let past = opt(inputs, 3);
    let bt = [d.batch, d.tokens];
    let decay = per_token(opt(inputs, 4), "decay", bt, &[d.hkv, d.hkv * d.dk])?;
    let beta = per_token(opt(inputs, 5), "beta", bt, &[d.hkv, 1])?;
    let rule = attrs.str("update_rule", "gated_delta");
    let (gating, delta) = xpu_ir::infer::linear_attention_update_rule(rule)?;
    if gating != decay.is_some() || delta != beta.is_some() {
        return Err(format!("update_rule {rule:?} does not match the decay and beta inputs given"));
    }
    let state_len = d.hkv * d.dk * d.dv;
    let mut state = match past {
        Some(p) if p.shape() == [d.batch, d.hkv, d.dk, d.dv] => flat(p)?,
        Some(p) => {
            return Err(format!(
                "past_state has shape {:?}; expected {:?}",
                p.shape(),
                [d.batch, d.hkv, d.dk, d.dv]
            ));
        }
        None => vec![0.0; d.batch * state_len],
    };
    // 0 (the default) means 1/√d_k.
    let scale = Some(attrs.float("scale", 0.0)).filter(|&s| s != 0.0);
    let scale = scale.unwrap_or(1.0 / (d.dk as f64).sqrt());
    let (qv, kv, vv) = (flat(q)?, flat(k)?, flat(v)?);
    let group = d.hq / d.hkv;
    let mut out = vec![0.0; d.batch * d.tokens * d.hq * d.dv];
    let mut update = vec![0.0; d.dv];
    for b in 0..d.batch {
        for t in 0..d.tokens {
            let bt = b * d.tokens + t;
            for h in 0..d.hkv {
                let s = &mut state[(b * d.hkv + h) * d.dk * d.dv..][..d.dk * d.dv];
                if let Some(g) = &decay {
                    for (i, row) in s.chunks_mut(d.dv).enumerate() {
                        let gate =
                            if g.per == d.hkv { g.at(bt, h) } else { g.at(bt, h * d.dk + i) };
                        row.iter_mut().for_each(|x| *x *= gate.exp());
                    }
                }
                let kt = &kv[bt * d.hkv * d.dk + h * d.dk..][..d.dk];
                let vt = &vv[bt * d.hkv * d.dv + h * d.dv..][..d.dv];
                update.copy_from_slice(vt);
                if let Some(beta) = &beta {
                    let rate = beta.at(bt, if beta.per == 1 { 0 } else { h });
                    for (m, u) in update.iter_mut().enumerate() {
                        let retrieved: f64 = (0..d.dk).map(|i| s[i * d.dv + m] * kt[i]).sum();
                        *u = rate * (*u - retrieved);
                    }
                }
                for (i, row) in s.chunks_mut(d.dv).enumerate() {
                    row.iter_mut().zip(&update).for_each(|(x, u)| *x += kt[i] * u);
                }
            }
            // Each query head reads the state of its KV head (heads grouped in order).
            for j in 0..d.hq {
                let s = &state[(b * d.hkv + j / group) * d.dk * d.dv..][..d.dk * d.dv];
                let qt = &qv[bt * d.hq * d.dk + j * d.dk..][..d.dk];
                let o = &mut out[bt * d.hq * d.dv + j * d.dv..][..d.dv];
                for (i, &qi) in qt.iter().enumerate() {
                    o.iter_mut().zip(&s[i * d.dv..][..d.dv]).for_each(|(o, x)| *o += qi * x);
                }
                o.iter_mut().for_each(|o| *o *= scale);
            }
        }
    }
    let y = from_f64(array(&[d.batch, d.tokens, d.hq * d.dv], out)?, q.dtype())?;
    let state_dtype = past.map_or(q.dtype(), Tensor::dtype);
    let present = from_f64(array(&[d.batch, d.hkv, d.dk, d.dv], state)?, state_dtype)?;
    Ok([y, present].into_iter().take(n_out).collect())
}

pub fn causal_conv_with_state(
    attrs: &Attrs,
    inputs: &[Option<&Tensor>],
    n_out: usize,
) -> KResult<Vec<Tensor>> {
    let (x, w) = (req(inputs, 0)?, req(inputs, 1)?);
    let [b, c, len] = shape3(x, "input")?;
    let [wc, one, k] = shape3(w, "weight")?;
    if wc != c || one != 1 || k == 0 {
        return Err(format!("weight has shape {:?}; expected [{c}, 1, K ≥ 1]", w.shape()));
    }
    let bias = match opt(inputs, 2) {
        Some(t) if t.shape() == [c] => Some(flat(t)?),
        Some(t) => return Err(format!("bias has shape {:?}; expected [{c}]", t.shape())),
        None => None,
    };
    let past = match opt(inputs, 3) {
        Some(t) if t.shape() == [b, c, k - 1] => flat(t)?,
        Some(t) => {
            return Err(format!(
                "past_state has shape {:?}; expected [{b}, {c}, {}]",
                t.shape(),
                k - 1
            ));
        }
        None => vec![0.0; b * c * (k - 1)],
    };
    checked_numel(&[b, c, len + k])?;
    let silu = match attrs.str("activation", "none") {
        "none" => false,
        "silu" | "swish" => true,
        a => return Err(format!("activation {a:?}: one of none, silu, swish")),
    };
    let (xv, wv) = (flat(x)?, flat(w)?);
    let width = k - 1 + len;
    let mut y = vec![0.0; b * c * len];
    let mut present = vec![0.0; b * c * (k - 1)];
    let mut padded = vec![0.0; width];
    for bc in 0..b * c {
        let ch = bc % c;
        padded[..k - 1].copy_from_slice(&past[bc * (k - 1)..][..k - 1]);
        padded[k - 1..].copy_from_slice(&xv[bc * len..][..len]);
        let taps = &wv[ch * k..][..k];
        for (p, out) in y[bc * len..][..len].iter_mut().enumerate() {
            let mut acc: f64 = padded[p..p + k].iter().zip(taps).map(|(a, b)| a * b).sum();
            acc += bias.as_ref().map_or(0.0, |bias| bias[ch]);
            *out = if silu { acc / (1.0 + (-acc).exp()) } else { acc };
        }
        present[bc * (k - 1)..][..k - 1].copy_from_slice(&padded[width - (k - 1)..]);
    }
    let y = from_f64(array(&[b, c, len], y)?, x.dtype())?;
    let present = from_f64(array(&[b, c, k - 1], present)?, x.dtype())?;
    Ok([y, present].into_iter().take(n_out).collect())
}
