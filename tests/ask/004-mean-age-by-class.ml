# question: What is the average age of passengers in each class, ignoring missing ages? Sorted by class.
# data: titanic.csv
print load_csv("titanic.csv")
  |> group_by("Pclass")
  |> agg(mean_age = mean(Age))
