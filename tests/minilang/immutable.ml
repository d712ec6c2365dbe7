# Assigning to an immutable binding points at both places.
let total = 0
for i in [1, 2, 3] {
  total = total + i
}
# ==== expected ====
error[E0101]: cannot assign twice to immutable binding `total`
  ┌─ immutable.ml:4:3
  │
2 │ let total = 0
  │     ----- first bound here
3 │ for i in [1, 2, 3] {
4 │   total = total + i
  │   ^^^^^ assigned again here
  │
  = help: make it mutable: `let mut total = …`

