# question: What is the Pearson correlation between Age and Fare over passengers whose age is known?
# data: titanic.csv
let x = tensor(load_csv("titanic.csv") |> filter(not_null(Age)), ["Age", "Fare"])
let c = x - mean(x, axis = 0)
print sum(c[:, 0] * c[:, 1]) / sqrt(sum(c[:, 0] * c[:, 0]) * sum(c[:, 1] * c[:, 1]))
