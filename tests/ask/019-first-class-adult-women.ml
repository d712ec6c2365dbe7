# question: How many women aged 18 or older travelled in first class?
# data: titanic.csv
print load_csv("titanic.csv")
  |> filter(Sex == "female" and Age >= 18 and Pclass == 1)
  |> agg(n = count())
