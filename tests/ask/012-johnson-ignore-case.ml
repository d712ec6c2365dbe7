# question: How many passengers have "johnson" in their name, ignoring upper/lower case, and how many of them survived? Show the two numbers in that order.
# data: titanic.csv
print load_csv("titanic.csv")
  |> filter(contains(lower(Name), "johnson"))
  |> agg(passengers = count(), survived = sum(Survived))
