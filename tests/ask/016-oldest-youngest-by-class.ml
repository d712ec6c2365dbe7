# question: What are the youngest and the oldest ages in each class? Show class, youngest, oldest, sorted by class.
# data: titanic.csv
print load_csv("titanic.csv")
  |> group_by("Pclass")
  |> agg(youngest = min(Age), oldest = max(Age))
