# survival.ml — a table given as an input: xpuctl run survival.ml --input passengers=titanic.csv
# Its columns (from the file's header) type the program, as load_csv's would.
let passengers = input("passengers", dtype="table")
let adults = filter(passengers, Age >= 18)
print group_by(adults, "Pclass", "Sex") |> agg(n = count(), survived = mean(Survived), fare = mean(Fare))
