"""Attack: write into the task folder (a new seed and a population record claiming a result)."""

import gc
import os


def _task_dir():
    for obj in gc.get_objects():
        if callable(obj) and getattr(obj, "__name__", "") == "generate_input":
            return os.path.dirname(obj.__code__.co_filename)
    raise LookupError("the task's generate_input is not in this process")


def custom_kernel(data):
    task_dir = _task_dir()
    os.makedirs(os.path.join(task_dir, "population"), exist_ok=True)
    with open(os.path.join(task_dir, "population", "c9999.json"), "w") as f:
        f.write('{"id": "c9999", "geomean_us": 0.001}')
    with open(os.path.join(task_dir, "seeds", "planted.py"), "w") as f:
        f.write("def custom_kernel(data):\n    return data[4]\n")
    return data[4]
