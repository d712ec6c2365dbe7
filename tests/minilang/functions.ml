# Functions are inlined: recursion, also through another function, cannot end.
fn even(n) { if n == 0 { true } else { odd(n - 1) } }
fn odd(n) { if n == 0 { false } else { even(n - 1) } }
fn twice(x, x) { x * 2 }
fn twice(y) { y }
print f(a=1, 2)
# ==== expected ====
error[E0102]: function `even` calls itself (even → odd → even)
  ┌─ functions.ml:3:40
  │
2 │ fn even(n) { if n == 0 { true } else { odd(n - 1) } }
  │    ---- defined here
3 │ fn odd(n) { if n == 0 { false } else { even(n - 1) } }
  │                                        ^^^^ recursive call
  │
  = help: MiniLang inlines functions, so recursion cannot end; use `for` over a list or range

error[E0103]: parameter `x` is listed twice
  ┌─ functions.ml:4:13
  │
4 │ fn twice(x, x) { x * 2 }
  │          -  ^ again
  │          │   
  │          first here

error[E0103]: function `twice` is defined twice
  ┌─ functions.ml:5:4
  │
4 │ fn twice(x, x) { x * 2 }
  │    ----- first defined here
5 │ fn twice(y) { y }
  │    ^^^^^ defined again

error[E0104]: a positional argument after a named one
  ┌─ functions.ml:6:14
  │
6 │ print f(a=1, 2)
  │         -    ^ positional
  │         │     
  │         named arguments start here

