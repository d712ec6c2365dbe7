# question: Give the mean, standard deviation and median of Age and Fare (statistics as rows, Age then Fare as columns).
# data: titanic.csv
print load_csv("titanic.csv")
  |> select(["Age", "Fare"])
  |> stats(["mean", "std", "50%"])
