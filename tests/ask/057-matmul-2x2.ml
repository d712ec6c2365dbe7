# question: What is the matrix product of [[1, 2], [3, 4]] and [[5, 6], [7, 8]]?
# data:
print [[1, 2], [3, 4]] @ [[5, 6], [7, 8]]
