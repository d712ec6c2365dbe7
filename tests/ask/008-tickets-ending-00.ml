# question: How many passengers have a ticket number ending in "00"?
# data: titanic.csv
print load_csv("titanic.csv")
  |> filter(ends_with(Ticket, "00"))
  |> agg(n = count())
