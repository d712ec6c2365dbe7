# question: What is the total fare paid per port and class? Show port, class and total, sorted by port then class, leaving out passengers with no port.
# data: titanic.csv
print load_csv("titanic.csv")
  |> group_by("Embarked", "Pclass")
  |> agg(total_fare = sum(Fare))
