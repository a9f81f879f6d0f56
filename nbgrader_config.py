"""nbgrader's view of the course.

solutions/NN_topic.ipynb is flat, while nbgrader wants <root>/source/<assignment>/<notebook>.
`make lessons` (tools/make_lessons.py) copies each solution into build/nbgrader/source/NN_topic/
and runs nbgrader's generate_assignment there; lessons/NN_topic.ipynb is nbgrader's release.
Instructors who drive the course through nbgrader run its commands from the repository root:

    nbgrader generate_assignment 00_first_kernel
    nbgrader autograde 00_first_kernel        # after collecting into build/nbgrader/submitted/<student>/00_first_kernel/
    nbgrader generate_feedback 00_first_kernel
"""
import os

c = get_config()  # noqa: F821  (provided by nbgrader)

here = os.path.dirname(os.path.abspath(__file__))
c.CourseDirectory.root = os.environ.get("MEMFIT_NBGRADER_ROOT", os.path.join(here, "build", "nbgrader"))
c.CourseDirectory.course_id = "memfit"
c.CourseDirectory.db_url = "sqlite:///" + os.path.join(c.CourseDirectory.root, "gradebook.db")
# The stub every solution region becomes.
c.ClearSolutions.code_stub = {"python": "# YOUR CODE HERE\nraise NotImplementedError()"}
# Graded cells need the course library on the path when nbgrader executes them.
c.Execute.timeout = 600
# Kernels nbgrader starts inherit this: a check that cannot run here (a GPU check on a CPU) raises
# "skipped: needs a GPU" and earns 0, instead of printing and passing (autograder.checks.skip).
os.environ["MEMFIT_GRADING"] = "1"
