//! Recurrent layers: `rnn`, `gru`, `lstm` (ONNX semantics): forward, reverse and
//! bidirectional, both layouts, custom activations with alpha/beta, `clip`, per-batch
//! `sequence_lens` (steps past a sequence's end output 0 and leave the state alone), LSTM
//! peepholes and `input_forget`, GRU `linear_before_reset`. Computed in f64.

use ndarray::{Array2, Array3, ArrayD, Axis, IxDyn, s};
use xpu_ir::{Attrs, Op, Tensor};

use crate::reduce::{from_f64, to_f64};
use crate::util::{KResult, ints, opt, req};

#[derive(Clone, Copy)]
enum Act {
    Sigmoid,
    Tanh,
    Relu,
    Affine(f64, f64),
    LeakyRelu(f64),
    ThresholdedRelu(f64),
    ScaledTanh(f64, f64),
    HardSigmoid(f64, f64),
    Elu(f64),
    Softsign,
    Softplus,
}

impl Act {
    fn apply(self, x: f64) -> f64 {
        match self {
            Act::Sigmoid => 1.0 / (1.0 + (-x).exp()),
            Act::Tanh => x.tanh(),
            Act::Relu => x.max(0.0),
            Act::Affine(a, b) => a * x + b,
            Act::LeakyRelu(a) => {
                if x >= 0.0 {
                    x
                } else {
                    a * x
                }
            }
            Act::ThresholdedRelu(a) => {
                if x > a {
                    x
                } else {
                    0.0
                }
            }
            Act::ScaledTanh(a, b) => a * (b * x).tanh(),
            Act::HardSigmoid(a, b) => (a * x + b).clamp(0.0, 1.0),
            Act::Elu(a) => {
                if x >= 0.0 {
                    x
                } else {
                    a * (x.exp() - 1.0)
                }
            }
            Act::Softsign => x / (1.0 + x.abs()),
            Act::Softplus => x.exp().ln_1p(),
        }
    }
}

/// The activation list: explicit names with alpha/beta consumed in order, or the defaults.
fn activations(attrs: &Attrs, defaults: &[Act], dirs: usize) -> KResult<Vec<Act>> {
    let Some(names) = attrs.strs("activations") else {
        return Ok(defaults.iter().copied().cycle().take(defaults.len() * dirs).collect());
    };
    let alphas = attrs.floats("activation_alpha").unwrap_or(&[]).to_vec();
    let betas = attrs.floats("activation_beta").unwrap_or(&[]).to_vec();
    let (mut ai, mut bi) = (0, 0);
    let mut alpha = |d: f64| {
        let v = alphas.get(ai).copied().unwrap_or(d);
        ai += 1;
        v
    };
    let mut beta = |d: f64| {
        let v = betas.get(bi).copied().unwrap_or(d);
        bi += 1;
        v
    };
    let acts: Vec<Act> = names
        .iter()
        .map(|n| {
            Ok(match n.to_ascii_lowercase().as_str() {
                "sigmoid" => Act::Sigmoid,
                "tanh" => Act::Tanh,
                "relu" => Act::Relu,
                "affine" => Act::Affine(alpha(1.0), beta(0.0)),
                "leakyrelu" => Act::LeakyRelu(alpha(0.01)),
                "thresholdedrelu" => Act::ThresholdedRelu(alpha(1.0)),
                "scaledtanh" => Act::ScaledTanh(alpha(1.0), beta(1.0)),
                "hardsigmoid" => Act::HardSigmoid(alpha(0.2), beta(0.5)),
                "elu" => Act::Elu(alpha(1.0)),
                "softsign" => Act::Softsign,
                "softplus" => Act::Softplus,
                other => return Err(format!("unknown activation `{other}`")),
            })
        })
        .collect::<KResult<_>>()?;
    if acts.len() == defaults.len() * dirs {
        Ok(acts)
    } else if acts.len() == defaults.len() {
        Ok(acts.iter().copied().cycle().take(defaults.len() * dirs).collect())
    } else {
        Err(format!("{} activations given, expected {}", acts.len(), defaults.len() * dirs))
    }
}

/// Runs one direction over `x` [seq, batch, input]; returns (Y [seq, batch, hidden], H, C).
#[allow(clippy::too_many_arguments)]
fn run_direction(
    op: Op,
    x: &Array3<f64>,
    w: &Array2<f64>,
    r: &Array2<f64>,
    b: &[f64],
    p: Option<&[f64]>,
    mut h: Array2<f64>,
    mut c: Array2<f64>,
    lens: &[usize],
    reverse: bool,
    acts: &[Act],
    attrs: &Attrs,
) -> (Array3<f64>, Array2<f64>, Array2<f64>) {
    let (seq, batch, _) = x.dim();
    let hidden = h.dim().1;
    let clip = attrs.opt_float("clip");
    let clipf = |v: f64| match clip {
        Some(c) => v.clamp(-c, c),
        None => v,
    };
    let gates = w.dim().0 / hidden;
    let (wb, rb) = b.split_at(gates * hidden);
    let linear_before_reset = attrs.int("linear_before_reset", 0) != 0;
    let input_forget = attrs.int("input_forget", 0) != 0;
    let mut y = Array3::<f64>::zeros((seq, batch, hidden));
    for step in 0..seq {
        let t = if reverse { seq - 1 - step } else { step };
        let xt = x.index_axis(Axis(0), t);
        let xw = xt.dot(&w.t()); // [batch, gates·hidden]
        let hr = h.dot(&r.t());
        for bi in 0..batch {
            // With sequence_lens, a reversed sequence starts at its own last step.
            let tt = if reverse {
                if lens[bi] == 0 || step >= lens[bi] { continue } else { lens[bi] - 1 - step }
            } else {
                t
            };
            if tt >= lens[bi] {
                continue;
            }
            let (xw_row, hr_row) = if reverse && tt != t {
                let xr = x.index_axis(Axis(0), tt).row(bi).dot(&w.t());
                (xr, hr.row(bi).to_owned())
            } else {
                (xw.row(bi).to_owned(), hr.row(bi).to_owned())
            };
            let g = |k: usize, j: usize| {
                xw_row[k * hidden + j]
                    + hr_row[k * hidden + j]
                    + wb[k * hidden + j]
                    + rb[k * hidden + j]
            };
            match op {
                Op::Rnn => {
                    for j in 0..hidden {
                        h[[bi, j]] = acts[0].apply(clipf(g(0, j)));
                    }
                }
                Op::Gru => {
                    let hprev = h.row(bi).to_owned();
                    let z: Vec<f64> = (0..hidden).map(|j| acts[0].apply(clipf(g(0, j)))).collect();
                    let rg: Vec<f64> = (0..hidden).map(|j| acts[0].apply(clipf(g(1, j)))).collect();
                    let rh = r.slice(s![2 * hidden.., ..]);
                    let cand: Vec<f64> = if linear_before_reset {
                        let hr2 = rh.dot(&hprev);
                        (0..hidden)
                            .map(|j| {
                                acts[1].apply(clipf(
                                    xw_row[2 * hidden + j]
                                        + wb[2 * hidden + j]
                                        + rg[j] * (hr2[j] + rb[2 * hidden + j]),
                                ))
                            })
                            .collect()
                    } else {
                        let gated: ndarray::Array1<f64> =
                            (0..hidden).map(|j| rg[j] * hprev[j]).collect();
                        let hr2 = rh.dot(&gated);
                        (0..hidden)
                            .map(|j| {
                                acts[1].apply(clipf(
                                    xw_row[2 * hidden + j]
                                        + wb[2 * hidden + j]
                                        + hr2[j]
                                        + rb[2 * hidden + j],
                                ))
                            })
                            .collect()
                    };
                    for j in 0..hidden {
                        h[[bi, j]] = (1.0 - z[j]) * cand[j] + z[j] * hprev[j];
                    }
                }
                _ => {
                    // Gate order i, o, f, c; peepholes P = [p_i, p_o, p_f].
                    let pe = |k: usize, j: usize| p.map(|p| p[k * hidden + j]).unwrap_or(0.0);
                    for j in 0..hidden {
                        let cprev = c[[bi, j]];
                        let i = acts[0].apply(clipf(g(0, j) + pe(0, j) * cprev));
                        let f = if input_forget {
                            1.0 - i
                        } else {
                            acts[0].apply(clipf(g(2, j) + pe(2, j) * cprev))
                        };
                        let cc = acts[1].apply(clipf(g(3, j)));
                        let cn = f * cprev + i * cc;
                        let o = acts[0].apply(clipf(g(1, j) + pe(1, j) * cn));
                        c[[bi, j]] = cn;
                        h[[bi, j]] = o * acts[2].apply(cn);
                    }
                }
            }
            y.slice_mut(s![tt, bi, ..]).assign(&h.row(bi));
        }
    }
    (y, h, c)
}

fn three(t: &Tensor, what: &str) -> KResult<Array3<f64>> {
    to_f64(t)?
        .into_dimensionality()
        .map_err(|_| format!("{what} must be 3-D, got shape {:?}", t.shape()))
}

pub fn recurrent(
    op: Op,
    attrs: &Attrs,
    inputs: &[Option<&Tensor>],
    n_out: usize,
) -> KResult<Vec<Tensor>> {
    let x_t = req(inputs, 0)?;
    let dtype = x_t.dtype();
    let layout = attrs.int("layout", 0);
    let mut x = three(x_t, "X")?;
    if layout == 1 {
        x = x.permuted_axes([1, 0, 2]).as_standard_layout().into_owned();
    }
    let w = three(req(inputs, 1)?, "W")?;
    let r = three(req(inputs, 2)?, "R")?;
    let (seq, batch, _) = x.dim();
    let dirs = w.dim().0;
    let direction = attrs.str("direction", "forward");
    let want_dirs = if direction == "bidirectional" { 2 } else { 1 };
    if dirs != want_dirs {
        return Err(format!("direction {direction} needs {want_dirs} weight sets, W has {dirs}"));
    }
    let hidden = r.dim().2;
    if attrs.opt_int("hidden_size").is_some_and(|hs| hs as usize != hidden) {
        return Err(format!(
            "hidden_size {} disagrees with R's {hidden}",
            attrs.int("hidden_size", 0)
        ));
    }
    let gates = match op {
        Op::Rnn => 1,
        Op::Gru => 3,
        _ => 4,
    };
    if w.dim().1 != gates * hidden || r.dim().1 != gates * hidden {
        return Err(format!(
            "W and R need {} rows per direction ({gates} gates × hidden {hidden})",
            gates * hidden
        ));
    }
    let b = match opt(inputs, 3) {
        Some(t) => to_f64(t)?
            .into_shape_with_order(IxDyn(&[dirs, 2 * gates * hidden]))
            .map_err(|_| format!("B must be [{dirs}, {}]", 2 * gates * hidden))?,
        None => ArrayD::zeros(IxDyn(&[dirs, 2 * gates * hidden])),
    };
    let lens: Vec<usize> = match opt(inputs, 4) {
        Some(t) => {
            ints(t, "sequence_lens")?.iter().map(|&l| (l.max(0) as usize).min(seq)).collect()
        }
        None => vec![seq; batch],
    };
    let state = |i: usize| -> KResult<Array3<f64>> {
        match opt(inputs, i) {
            Some(t) => {
                let s = three(t, "initial state")?;
                Ok(if layout == 1 {
                    s.permuted_axes([1, 0, 2]).as_standard_layout().into_owned()
                } else {
                    s
                })
            }
            None => Ok(Array3::zeros((dirs, batch, hidden))),
        }
    };
    let h0 = state(5)?;
    let c0 = if op == Op::Lstm { state(6)? } else { Array3::zeros((dirs, batch, hidden)) };
    let p = if op == Op::Lstm { opt(inputs, 7).map(to_f64).transpose()? } else { None };
    let defaults: &[Act] = match op {
        Op::Rnn => &[Act::Tanh],
        Op::Gru => &[Act::Sigmoid, Act::Tanh],
        _ => &[Act::Sigmoid, Act::Tanh, Act::Tanh],
    };
    let acts = activations(attrs, defaults, dirs)?;
    let mut y = ndarray::Array4::<f64>::zeros((seq, dirs, batch, hidden));
    let mut yh = Array3::<f64>::zeros((dirs, batch, hidden));
    let mut yc = Array3::<f64>::zeros((dirs, batch, hidden));
    for d in 0..dirs {
        let reverse = direction == "reverse" || d == 1;
        let pd: Option<Vec<f64>> =
            p.as_ref().map(|p| p.index_axis(Axis(0), d).iter().copied().collect());
        let bd: Vec<f64> = b.index_axis(Axis(0), d).iter().copied().collect();
        let (yd, hd, cd) = run_direction(
            op,
            &x,
            &w.index_axis(Axis(0), d).to_owned(),
            &r.index_axis(Axis(0), d).to_owned(),
            &bd,
            pd.as_deref(),
            h0.index_axis(Axis(0), d).to_owned(),
            c0.index_axis(Axis(0), d).to_owned(),
            &lens,
            reverse,
            &acts[d * defaults.len()..(d + 1) * defaults.len()],
            attrs,
        );
        y.slice_mut(s![.., d, .., ..]).assign(&yd);
        yh.slice_mut(s![d, .., ..]).assign(&hd);
        yc.slice_mut(s![d, .., ..]).assign(&cd);
    }
    let (y, yh, yc) = if layout == 1 {
        (
            y.permuted_axes([2, 0, 1, 3]).as_standard_layout().into_owned().into_dyn(),
            yh.permuted_axes([1, 0, 2]).as_standard_layout().into_owned().into_dyn(),
            yc.permuted_axes([1, 0, 2]).as_standard_layout().into_owned().into_dyn(),
        )
    } else {
        (y.into_dyn(), yh.into_dyn(), yc.into_dyn())
    };
    let mut out = vec![from_f64(y, dtype)?];
    if n_out > 1 {
        out.push(from_f64(yh, dtype)?);
    }
    if n_out > 2 {
        out.push(from_f64(yc, dtype)?);
    }
    Ok(out)
}
