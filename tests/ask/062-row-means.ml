# question: What is the mean of each row of the matrix [[1, 2, 3], [4, 5, 6]]?
# data:
print mean([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]], axis = 1)
