# question: Make a table of survival rates with one row per class and one column per sex.
# data: titanic.csv
print pivot(load_csv("titanic.csv"), index = "Pclass", columns = "Sex", values = "Survived", agg = "mean")
