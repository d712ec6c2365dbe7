# question: Among passengers with a known age, what are the mean Age and the mean Fare? Give them as a vector [mean age, mean fare].
# data: titanic.csv
let known = load_csv("titanic.csv") |> filter(not_null(Age))
print mean(tensor(known, ["Age", "Fare"]), axis = 0)
