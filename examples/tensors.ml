# A small tensor pipeline in MiniLang: a seeded two-layer network on a toy batch.
# Run it with `xpuctl run examples/tensors.ml`; see the graph with `xpuctl ir print`.

let x = [[0.5, -1.0, 2.0, 0.0],
         [1.5, 0.25, -0.5, 1.0],
         [-2.0, 1.0, 0.5, 0.75]]

fn dense(input, w, b, act="relu") {
  let y = input @ w + b
  if act == "relu" { relu(y) } else { y }
}

let w1 = randn([4, 8], seed=1) * 0.5
let w2 = randn([8, 3], seed=2) * 0.5
let hidden = dense(x, w1, zeros([8]))
let logits = dense(hidden, w2, zeros([3]), act="none")
let probs = softmax(logits)

print "class probabilities per row:"
print probs
print "row sums (all 1):"
print sum(probs, axis=1)
print "largest probability of row 0:"
print max(probs[0])
write_npy(probs, "probs.npy")
