# question: How many passengers survived in each class? Show the class and the number of survivors, sorted by class.
# data: titanic.csv
print load_csv("titanic.csv")
  |> group_by("Pclass")
  |> agg(survivors = sum(Survived))
