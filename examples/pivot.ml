# Survival rate by class and sex: a pivot table, then the passenger counts behind it.
let people = load_csv("titanic.csv")
print pivot(people, index = "Pclass", columns = "Sex", values = "Survived", agg = "mean")
print people
  |> filter(Age >= 18)
  |> group_by("Pclass", "Sex")
  |> agg(adults = count(), mean_age = mean(Age), mean_fare = mean(Fare))
