# question: List the passengers whose cabin starts with "B" and who are older than 50: PassengerId, Name, Age and Cabin, in passenger id order.
# data: titanic.csv
print load_csv("titanic.csv")
  |> filter(starts_with(Cabin, "B") and Age > 50)
  |> select(["PassengerId", "Name", "Age", "Cabin"])
