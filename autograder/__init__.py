"""The course's autograder: loads graded code from notebooks without a Jupyter server, runs each
check in its own subprocess with a time limit, and writes a gradebook and feedback."""
