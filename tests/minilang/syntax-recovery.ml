# One run reports every syntax error: the parser resumes at the next statement.
let a = (1 +
let b = [1, 2 3]
let c = "unterminated
print a $ b
let d = 1 < 2 < 3
print c |> 5
# ==== expected ====
error[E0004]: expected an expression, found `let`
  ┌─ syntax-recovery.ml:3:1
  │
3 │ let b = [1, 2 3]
  │ ^^^ expected an expression

error[E0004]: expected `]` or `,`, found number `3`
  ┌─ syntax-recovery.ml:3:15
  │
3 │ let b = [1, 2 3]
  │               ^ expected `]` or `,`

error[E0002]: unterminated string
  ┌─ syntax-recovery.ml:4:9
  │
4 │ let c = "unterminated
  │         ^^^^^^^^^^^^^

error[E0001]: unexpected character
  ┌─ syntax-recovery.ml:5:9
  │
5 │ print a $ b
  │         ^

error[E0008]: comparisons cannot be chained
  ┌─ syntax-recovery.ml:6:15
  │
6 │ let d = 1 < 2 < 3
  │               ^ a second comparison
  │
  = help: combine them with `and`: `a < b and b < c`

error[E0105]: the right side of `|>` must be a function call
  ┌─ syntax-recovery.ml:7:12
  │
7 │ print c |> 5
  │         -- ^ not a function
  │         │   
  │         piped here
  │
  = help: write `value |> f(args)`, meaning `f(value, args)`

