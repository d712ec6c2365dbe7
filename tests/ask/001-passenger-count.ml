# question: How many passengers are in the titanic passenger list?
# data: titanic.csv
print load_csv("titanic.csv") |> agg(passengers = count())
