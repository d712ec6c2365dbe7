# Typos get a did-you-mean; bare names inside filter() are columns, checked later.
let data = load_csv("titanic.csv")
let adults = data |> filtr(Age >= 18)
print stats(dta, ["mean"])
print filter(data, Age >= 18 and Sex == "female")
# ==== expected ====
error[E0100]: unknown function `filtr`
  ┌─ unknown-names.ml:3:22
  │
3 │ let adults = data |> filtr(Age >= 18)
  │                      ^^^^^ not defined before this point
  │
  = help: did you mean `filter`?

error[E0100]: unknown name `dta`
  ┌─ unknown-names.ml:4:13
  │
4 │ print stats(dta, ["mean"])
  │             ^^^ not defined before this point
  │
  = help: did you mean `data`?

