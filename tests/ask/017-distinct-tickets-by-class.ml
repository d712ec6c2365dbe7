# question: How many distinct ticket numbers are there in each class? Sorted by class.
# data: titanic.csv
print load_csv("titanic.csv")
  |> group_by("Pclass")
  |> agg(tickets = nunique(Ticket))
