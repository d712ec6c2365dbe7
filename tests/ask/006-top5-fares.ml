# question: Who paid the five highest fares? Show Name and Fare, highest fare first.
# data: titanic.csv
print load_csv("titanic.csv")
  |> sort(["Fare"], desc = true)
  |> head(5)
  |> select(["Name", "Fare"])
