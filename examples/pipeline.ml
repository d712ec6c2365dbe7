# From a table to a model: numeric columns become a tensor, standardised, then scored by the
# small MLP in mlp.onnx (16 inputs: the 6 features, repeated) — tables on DuckDB, tensors on
# the CPU engine, all in one plan.
let people = load_csv("titanic.csv") |> filter(not_null(Age)) |> head(4)
let x = tensor(people, ["Pclass", "Age", "SibSp", "Parch", "Fare", "Survived"])
let centred = x - mean(x, axis = 0, keepdims = true)
let z = centred / (sqrt(mean(centred * centred, axis = 0, keepdims = true)) + 1e-9)
let net = model("mlp.onnx")
let outputs = net(cast(concat([z, z, z[:, 0:4]], axis = 1), "f32"))  # [probs, logits]
let scores = softmax(outputs[1], axis = -1)   # the model's own probs, recomputed from its logits
print scores
print max(abs(scores - outputs[0]))
print sum(scores, axis = 1)
