from todo.models import Task


class TodoList:

    def __init__(self):
        self._tasks = []

    def add(self, title, priority=2):
        if priority not in (1, 2, 3):
            raise ValueError("priority must be 1, 2 or 3")
        task = Task(title, priority)
        self._tasks.append(task)
        return task

    def complete(self, title):
        for task in self._tasks:
            if task.title == title and not task.done:
                task.done = True
                return task
        raise KeyError(title)

    def pending(self):
        return [t for t in self._tasks if not t.done]
