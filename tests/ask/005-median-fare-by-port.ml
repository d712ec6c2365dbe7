# question: What is the median fare for each port of embarkation? Show port and median fare, sorted by port, leaving out passengers with no port.
# data: titanic.csv
print load_csv("titanic.csv")
  |> group_by("Embarked")
  |> agg(median_fare = median(Fare))
