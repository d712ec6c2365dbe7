# question: How many passengers have the title "Miss." in their name?
# data: titanic.csv
print load_csv("titanic.csv")
  |> filter(contains(Name, "Miss."))
  |> agg(n = count())
