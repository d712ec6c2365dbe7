# Charts of the passenger list: fares by age (scatter), an age histogram, passengers by port.
let people = load_csv("titanic.csv") |> filter(not_null(Age))
plot(people, x = "Age", y = "Fare", kind = "scatter", out = "fares.png", title = "Fare by age")
plot(people, y = "Age", kind = "hist", out = "ages.svg", title = "Ages")
let ports = value_counts(load_csv("titanic.csv"), "Embarked")
plot(ports, x = "Embarked", y = "count", kind = "bar", out = "ports.png", title = "Passengers by port")
