"""The course's autograder: loads graded code from notebooks without a Jupyter server, grades each
student x lesson in its own process under time, memory and network limits, and writes a gradebook and feedback."""
