# question: How many passengers embarked at each port? Most frequent port first.
# data: titanic.csv
print load_csv("titanic.csv") |> value_counts("Embarked")
