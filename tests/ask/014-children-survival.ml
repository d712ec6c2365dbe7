# question: How many passengers were younger than 12, and what fraction of them survived? Show the count, then the rate.
# data: titanic.csv
print load_csv("titanic.csv")
  |> filter(Age < 12)
  |> agg(children = count(), survival_rate = mean(Survived))
