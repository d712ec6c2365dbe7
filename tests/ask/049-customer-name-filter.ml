# question: Which customers have "corp" or "ind" in their name, ignoring case? List each such customer once, sorted by name.
# data: orders.csv
print load_csv("orders.csv")
  |> filter(contains(lower(customer), "corp") or contains(lower(customer), "ind"))
  |> select(["customer"])
  |> distinct
  |> sort(["customer"])
