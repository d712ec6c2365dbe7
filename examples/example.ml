# example.ml
let data = load_csv("titanic.csv")
print stats(data, ["mean", "std", "50%"])
