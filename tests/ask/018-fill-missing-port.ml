# question: Count the passengers per port of embarkation, counting passengers with no port as "S". Sorted by port.
# data: titanic.csv
print load_csv("titanic.csv")
  |> with_column(Embarked = fill_null(Embarked, "S"))
  |> group_by("Embarked")
  |> agg(passengers = count())
