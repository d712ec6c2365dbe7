# question: How many passengers have no recorded age?
# data: titanic.csv
print load_csv("titanic.csv")
  |> filter(is_null(Age))
  |> agg(missing_age = count())
