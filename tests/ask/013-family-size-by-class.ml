# question: Family size is SibSp + Parch + 1. What is the average family size in each class? Sorted by class.
# data: titanic.csv
print load_csv("titanic.csv")
  |> with_column(family = SibSp + Parch + 1)
  |> group_by("Pclass")
  |> agg(mean_family = mean(family))
